"""A Django app for the fair-share and limit tests on real processes only
(tests/ingress/test_fair_share_processes.py): installed by its own settings module
(`settings.py` here) in the `process_inbox` processes those tests start.

- `handlers.py`: PACED calls a real HTTP downstream (PACED_DOWNSTREAM_URL) and turns its 429
  into DownstreamRateLimited, declared with a rate of 20 a second and 4 at once; FRESH does
  nothing (its events' handling latency is the point).
"""
