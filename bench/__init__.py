

# bench/console_scale.py's stand-ins for a deployment's GitHub and Slack handlers (registered
# by that bench only): its store's deliveries name them, as a real store names handlers that
# are registered.


def github_push(event: object, payload: dict) -> None:
    """Nothing: the console bench never runs a handler."""


def slack_message(event: object, payload: dict) -> None:
    """Nothing: the console bench never runs a handler."""


def register_console_bench_handlers() -> None:
    from ingress.handlers import webhook_handler

    webhook_handler(provider="github", event_types=["push"])(github_push)
    webhook_handler(provider="slack", event_types=["event_callback"])(slack_message)
