import os

from examples.payment_api.app import create_app, token_client_from_env

create_app(token_client_from_env(os.environ)).run(port=int(os.environ.get("PORT", "5000")))
