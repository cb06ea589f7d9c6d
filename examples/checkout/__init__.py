"""A demo checkout: a shop whose "Pay" is guarded by a one-time token.

``python -m examples.checkout`` starts the token service (embedded store) and
the shop on two ports, so the page really talks to the token service
cross-origin (with a CORS preflight). See docs/frontend.md.
"""

from examples.checkout.demo import Demo
from examples.checkout.shop import create_shop

__all__ = ["Demo", "create_shop"]
