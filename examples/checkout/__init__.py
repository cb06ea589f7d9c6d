"""A demo checkout: a shop whose "Pay" runs at most once per order.

``python -m examples.checkout`` starts the shop and a token service (embedded
store) on two free ports, or only the shop with ``--token-service URL``; the
page talks to the token service cross-origin (with a CORS preflight). See
docs/frontend.md.
"""

from examples.checkout.demo import Demo
from examples.checkout.shop import create_shop

__all__ = ["Demo", "create_shop"]
