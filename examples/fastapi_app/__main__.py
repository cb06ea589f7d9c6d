import os

import uvicorn

uvicorn.run("examples.fastapi_app.app:app", host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
