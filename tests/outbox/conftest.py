from tests.recaps.fixtures import fake_renderer, paid_recap  # noqa: F401  (fixtures)
