"""Settings for bench/ingress_ack.py only: the production settings, plus a URLconf that adds
a trivial view next to the real ones, so the production URLs stay clean."""

from eventdrop.settings import *  # noqa: F403

ROOT_URLCONF = "bench.urls_bench"
