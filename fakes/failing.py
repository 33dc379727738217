"""A handler that always fails, for trying the console's incidents locally (`manage.py demo
--failing`): registered only where EVENTDROP_DEMO_FAILING_HANDLER is on (by default with
DJANGO_DEBUG, i.e. `make run`), never in production. It takes GitHub events of the type
`eventdrop_demo_failure` (the X-GitHub-Event header) and gives each up at once: one dead
delivery per event, grouped as one incident on /ops/incidents/."""

from ingress.handlers import webhook_handler
from ingress.models import RawEvent
from kernel.errors import PermanentError

DEMO_FAILURE_EVENT = "eventdrop_demo_failure"


class DemoFailure(PermanentError):
    permanent_reason = "demo_failure"


@webhook_handler(provider="github", event_types=[DEMO_FAILURE_EVENT])
def demo_failure(event: RawEvent, payload: dict) -> None:
    raise DemoFailure("the demo's failing handler fails on purpose (manage.py demo --failing)")
