from tests.recaps.fixtures import fake_renderer, fake_stripe, paid_recap  # noqa: F401
