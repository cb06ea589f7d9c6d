"""Start a worker, send each task twice, show that each ran once, stop the worker.

    python -m examples.celery_app

Needs a broker (RabbitMQ on localhost by default; CELERY_BROKER_URL) and a
Redis (TOKEN_SERVICE_REDIS_URL, default redis://127.0.0.1:6379/0).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys

from examples.celery_app.tasks import QUEUE, app, charge, emails, send_receipt


def main() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "examples.celery_app.tasks", "--quiet", "worker",
         "--pool=solo", "-Q", QUEUE, "--loglevel=WARNING", "--without-mingle", "--without-gossip"],
        env=os.environ.copy(),
    )  # fmt: skip
    try:
        emails.delete("example:sent")
        order = f"order-{secrets.token_hex(3)}"
        task_id = secrets.token_hex(8)
        # the same message twice (a broker redelivery looks like this), and two messages for one order
        receipts = [send_receipt.apply_async((order, "ada@example.com"), task_id=task_id) for _ in range(2)]
        charges = [charge.delay(order, 1250) for _ in range(2)]
        labels = (
            f"send_receipt, task id {task_id}:",
            "the same message delivered again:",
            f"charge {order}, one message:",
            "another message for the same order:",
        )
        # one solo worker takes them in order: the last charge's result means all four ran
        for label, result in zip(labels, receipts + charges, strict=True):
            print(label.ljust(40), result.get(timeout=60))
        sent = [line.decode() for line in emails.lrange("example:sent", 0, -1)]
        print("what actually happened:", sent)
        verdict = "each body ran once" if len(sent) == 2 else "duplicates!"
        print(f"4 messages, {len(sent)} side effects: {verdict}")
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(QUEUE)
    finally:
        worker.send_signal(signal.SIGQUIT)
        worker.wait(timeout=30)


if __name__ == "__main__":
    main()
