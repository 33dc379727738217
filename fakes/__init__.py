"""Local stand-ins for what cannot run here: the render service, Stripe, and the demo that
drives a recap through both (`make run`, the tests). No production process imports it."""
