"""The operators' tools: records found, shown, revoked, released (``admin``) and reconciled (``reconcile``).

They read what both the service and the SDK write (token records, the
Idempotency-Key middlewares' stored responses, the durable backstop's rows),
so they sit above core and the SDK and import both; ``server/`` serves them
as ``token-service admin`` and the ``/admin/`` routes (docs/operations.md).

Some of the names they use are the SDK's private ones, on purpose: how an
Idempotency-Key record is keyed (``client._idempotency_store.digest``), how a
record of the middlewares' format before 0.2.0 is read (``read_earlier``; the
record itself is the common one, read by ``records.read_record``) and how its
stored response is encoded (``client._stored_response.StoredResponse``) have one
definition, the SDK's, shipped in the same package, and are no public API for
users; so have the durable backstop's default table, its PROCESSING status and its
database clock (``client.durable._schema``, ``_guard``), which ``reconcile`` reads the
stuck rows with. tests/test_layout.py lists what of the SDK's private modules ``ops/``
may import, so a new one is a choice.
"""

__all__: list[str] = []
