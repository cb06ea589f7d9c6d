"""State-machine transitions and optimistic-lock updates as single conditional UPDATEs.

Both put the check into the UPDATE's WHERE clause, so the database decides
atomically: there is no window between reading the state (or version) and
writing the new one. Zero rows changed means the precondition did not hold;
only then is the row read, to say why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from token_service.errors import IllegalTransition, RowNotFound, StaleVersion

__all__ = ["StateMachine", "update_versioned"]


class StateMachine:
    """A declared transition table over one status column of one table: ``{state: {targets}}``,
    every target a declared state (docs/durable.md, State machines)."""

    def __init__(
        self,
        table: sa.Table,
        transitions: Mapping[str, Iterable[str]],
        *,
        status_column: str = "status",
        key_column: str = "id",
    ) -> None:
        self.table = table
        self.status = table.c[status_column]
        self.key = table.c[key_column]
        self.transitions: dict[str, frozenset[str]] = {
            state: frozenset(targets) for state, targets in transitions.items()
        }
        undeclared = {t for targets in self.transitions.values() for t in targets} - set(self.transitions)
        if undeclared:
            raise ValueError(f"transition targets that are not declared states: {sorted(undeclared)}")

    @property
    def states(self) -> frozenset[str]:
        return frozenset(self.transitions)

    def allowed_from(self, target: str) -> frozenset[str]:
        """The states from which ``target`` may be entered."""
        return frozenset(state for state, targets in self.transitions.items() if target in targets)

    def check(self, current: str, target: str) -> None:
        """Raise ``IllegalTransition`` unless ``current`` → ``target`` is declared (no database)."""
        if target not in self.transitions.get(current, frozenset()):
            raise IllegalTransition(
                f"{current} → {target} is not an allowed transition",
                current=current,
                target=target,
                allowed_from=self.allowed_from(target),
            )

    def transition(
        self,
        conn: Connection,
        row_id: Any,
        target: str,
        *,
        expected: str | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        """Move row ``row_id`` to ``target`` if it is in a state that allows it.

        ``UPDATE … SET status = :target WHERE id = :id AND status IN (:allowed_from)``,
        with ``values`` written in the same statement. ``expected`` narrows the
        allowed sources to the state the caller believes the row is in. Moves
        the table does not allow are refused before any SQL runs.
        """
        for state in (target, expected):
            if state is not None and state not in self.transitions:
                raise IllegalTransition(
                    f"{state!r} is not a state of this machine", row_id=row_id, target=target
                )
        sources = self.allowed_from(target)
        if expected is not None:
            sources &= {expected}
        if not sources:
            raise IllegalTransition(
                f"{expected or 'no state'} → {target} is not an allowed transition",
                row_id=row_id,
                target=target,
                allowed_from=self.allowed_from(target),
            )
        current = _update_if(
            conn,
            self.table,
            self.key,
            row_id,
            where=self.status.in_(sorted(sources)),
            values={self.status.key: target, **(values or {})},
            found=self.status,
        )
        if current is None:
            return
        raise IllegalTransition(
            f"row {row_id!r} is {current}; {target} can only be entered from {', '.join(sorted(sources))}",
            row_id=row_id,
            current=current,
            target=target,
            allowed_from=sources,
        )


def update_versioned(
    conn: Connection,
    table: sa.Table,
    row_id: Any,
    expected_version: int,
    values: Mapping[str, Any],
    *,
    key_column: str = "id",
    version_column: str = "version",
) -> int:
    """Optimistic lock: write ``values`` only if the row is still at ``expected_version``.

    ``UPDATE … SET …, version = version + 1 WHERE id = :id AND version = :expected``.
    Returns the new version; raises ``StaleVersion`` (with the version found)
    when someone else updated the row first, ``RowNotFound`` when it is gone.
    """
    key = table.c[key_column]
    version = table.c[version_column]
    if version_column in values:
        raise ValueError(f"{version_column} is maintained by update_versioned; do not set it")
    actual = _update_if(
        conn,
        table,
        key,
        row_id,
        where=version == expected_version,
        values={**values, version_column: version + 1},
        found=version,
    )
    if actual is None:
        return expected_version + 1
    raise StaleVersion(
        f"row {row_id!r} of {table.name} is at version {actual}, not {expected_version}",
        row_id=row_id,
        expected=expected_version,
        actual=int(actual),
    )


def _update_if(
    conn: Connection,
    table: sa.Table,
    key: sa.Column[Any],
    row_id: Any,
    *,
    where: sa.ColumnElement[bool],
    values: Mapping[str, Any],
    found: sa.Column[Any],
) -> Any:
    """Write ``values`` to row ``row_id`` in one UPDATE that also asks ``where``: None when it held,
    else the row's ``found`` column (its state, its version), read to say why; ``RowNotFound``
    when there is no row (or that value is NULL: nothing to tell either)."""
    if conn.execute(sa.update(table).where(key == row_id, where).values(values)).rowcount == 1:
        return None
    value = conn.execute(sa.select(found).where(key == row_id)).scalar_one_or_none()
    if value is None:
        raise RowNotFound(f"no row {row_id!r} in {table.name}", row_id=row_id)
    return value
