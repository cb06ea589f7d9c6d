"""Real Redis topologies for tests, started from the ``redis-server`` binary on free ports.

- :class:`Standalone`: one server (wraps :class:`RedisServer`).
- :class:`ClusterTopology`: N masters joined with ``redis-cli --cluster create``.
- :class:`SentinelTopology`: a master, a replica and three sentinels.

Each has ``url`` (a ``TOKEN_SERVICE_REDIS_URL``), ``client()`` (a redis-py client
of the right kind), ``flush()`` and ``stop()``. Everything runs on 127.0.0.1 in
temp dirs and is removed on stop.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import redis
import redis.cluster
import redis.sentinel

from tests.support.processes import RedisServer, free_port, redis_server_binary, wait_until

MASTER_NAME = "tsmaster"


class Topology(Protocol):
    name: str

    @property
    def url(self) -> str: ...

    def client(self) -> Any: ...

    def flush(self) -> None: ...

    def stop(self) -> None: ...


class Standalone:
    name = "standalone"

    def __init__(self, *extra_args: str) -> None:
        self.server = RedisServer(*extra_args)

    def start(self) -> Standalone:
        self.server.start()
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def client(self) -> redis.Redis:
        return self.server.client()

    def flush(self) -> None:
        with self.server.client() as client:
            client.flushall()
            client.script_flush()

    def stop(self) -> None:
        self.server.stop()


class ClusterTopology:
    """``masters`` primaries, no replicas, all 16384 slots covered."""

    name = "cluster"

    def __init__(
        self, masters: int = 3, node_timeout_ms: int = 5000, redis_args: tuple[str, ...] = ()
    ) -> None:
        # 5 s: a node that a loaded CI machine stalls for a second or two must not be failed (without
        # replicas that takes the whole cluster down); no test waits for a node to be failed
        self.nodes = [
            RedisServer(
                *redis_args,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout_ms),
                # the bus port must be free too; port+10000 may not be
                "--cluster-port",
                str(free_port()),
            )
            for _ in range(masters)
        ]

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(self.addresses)

    def start(self) -> ClusterTopology:
        for node in self.nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create", *self.addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_healthy()
        return self

    def wait_healthy(self, timeout_seconds: float = 60.0) -> None:
        def ok() -> bool:
            views = set()
            for node in self.nodes:
                with node.client(socket_timeout=1) as client:
                    if client.cluster("info")["cluster_state"] != "ok":  # type: ignore[index]
                        return False
                    views.add(self._slot_view(client))
            return len(views) == 1  # every node agrees on who owns what

        wait_until(ok, timeout_seconds=timeout_seconds, what="cluster state ok")

    @staticmethod
    def _slot_view(client: redis.Redis) -> tuple[tuple[int, int, int], ...]:
        slots = client.execute_command("CLUSTER", "SLOTS")
        return tuple(sorted((int(s[0]), int(s[1]), int(s[2][1])) for s in slots))

    def client(self, **options: Any) -> redis.cluster.RedisCluster:
        startup = [redis.cluster.ClusterNode("127.0.0.1", node.port) for node in self.nodes]
        return redis.cluster.RedisCluster(startup_nodes=startup, **options)

    def node_owning(self, key: str | bytes) -> RedisServer:
        slot = redis.cluster.key_slot(key.encode() if isinstance(key, str) else key)
        with self.nodes[0].client() as client:
            for start, end, owner_port in self._slot_view(client):
                if start <= slot <= end:
                    return next(node for node in self.nodes if node.port == owner_port)
        raise LookupError(f"slot {slot} is not covered")

    def node_id(self, node: RedisServer) -> str:
        with node.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())

    def migrate_slot(
        self, slot: int, target: RedisServer, *, batch: int = 10, pause_seconds: float = 0
    ) -> int:
        """Move one slot to ``target`` the way ``redis-cli --cluster reshard`` does:
        SETSLOT IMPORTING/MIGRATING, MIGRATE the keys in batches, SETSLOT NODE everywhere.
        ``pause_seconds`` between batches keeps the slot half-migrated (ASK redirects) for a while.
        Returns how many keys moved."""
        source = next(node for node in self.nodes if self._owns(node, slot))
        if source is target:
            raise ValueError("the target already owns the slot")
        source_id, target_id = self.node_id(source), self.node_id(target)
        moved = 0
        with source.client() as src, target.client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause_seconds)
            for node in self.nodes:
                with node.client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_healthy()
        return moved

    def _owns(self, node: RedisServer, slot: int) -> bool:
        with node.client() as client:
            return any(
                start <= slot <= end and owner == node.port for start, end, owner in self._slot_view(client)
            )

    def flush(self) -> None:
        for node in self.nodes:
            with node.client() as client:
                client.flushall()
                client.script_flush()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelServer:
    """One ``redis-server --sentinel`` watching ``MASTER_NAME``."""

    def __init__(
        self, master_port: int, *, down_after_ms: int = 3000, failover_timeout_ms: int = 4000
    ) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ts-sentinel-"))
        self.config = self.dir / "sentinel.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {self.dir}",
                    f"logfile {self.dir / 'sentinel.log'}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
                    f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}",
                    f"sentinel parallel-syncs {MASTER_NAME} 1",
                    "",
                ]
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelServer:
        self.process = subprocess.Popen(
            [redis_server_binary(), str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: self.client().ping(), what=f"sentinel on {self.port}")
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, decode_responses=True)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelTopology:
    """A master, one replica and three sentinels (quorum 2)."""

    name = "sentinel"

    # 3 s: a master that a loaded CI machine stalls for a second must not be failed over in the middle
    # of a test that does not expect it; the failover test pays the 2 s more
    def __init__(self, *redis_args: str, down_after_ms: int = 3000) -> None:
        self.redis_args = redis_args
        self.down_after_ms = down_after_ms
        self.master = RedisServer(*redis_args)
        self.replica: RedisServer | None = None
        self.sentinels: list[SentinelServer] = []
        self.retired: list[RedisServer] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}"

    def start(self, *, ready_to_fail_over: bool = False) -> SentinelTopology:
        """``ready_to_fail_over`` also waits (~5 s of hello messages) until every sentinel
        knows the others and the replica; serving clients needs only the master's address."""
        self.master.start()
        self.replica = RedisServer(
            *self.redis_args, "--replicaof", "127.0.0.1", str(self.master.port)
        ).start()
        wait_until(self._replica_in_sync, what="replica in sync")
        self.sentinels = [
            SentinelServer(self.master.port, down_after_ms=self.down_after_ms).start() for _ in range(3)
        ]
        if ready_to_fail_over:
            self.wait_ready_to_fail_over()
        return self

    def wait_ready_to_fail_over(self) -> None:
        wait_until(self._sentinels_agree, timeout_seconds=30, what="sentinels discover each other")

    def _replica_in_sync(self) -> bool:
        assert self.replica is not None
        with self.replica.client() as client:
            return client.info("replication").get("master_link_status") == "up"

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                if len(client.sentinel_sentinels(MASTER_NAME)) != len(self.sentinels) - 1:
                    return False
                if not client.sentinel_slaves(MASTER_NAME):
                    return False
        return True

    def sentinel(self) -> redis.sentinel.Sentinel:
        return redis.sentinel.Sentinel(
            [("127.0.0.1", s.port) for s in self.sentinels], sentinel_kwargs={"socket_timeout": 1}
        )

    def master_address(self) -> tuple[str, int]:
        with self.sentinels[0].client() as client:
            host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        return str(host), int(port)

    def client(self) -> redis.Redis:
        return self.sentinel().master_for(MASTER_NAME, socket_timeout=1)

    def kill_master(self) -> tuple[int, int]:
        """kill -9 the master and wait for the sentinels to promote the replica.
        Returns (old port, new port)."""
        assert self.replica is not None
        old = self.master
        old.kill()
        wait_until(
            lambda: self.master_address()[1] == self.replica.port,  # type: ignore[union-attr]
            timeout_seconds=30,
            what="sentinel failover",
        )
        self.retired.append(old)
        self.master, self.replica = self.replica, None
        return old.port, self.master.port

    def flush(self) -> None:
        with self.master.client() as client:
            client.flushall()
            client.script_flush()
            # the replica must have seen the flush before the next test reads
            client.wait(1 if self.replica else 0, 2000)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in [self.master, self.replica, *self.retired]:
            if server is not None:
                server.stop()
