"""hcc.backends.ray.group — hcc inside a user's own Ray actors, Ray's collective-group
convention: ``init_group(world, rank, name)`` in every member, then ``hcc.run(plan, comm, x)``
as often as needed, ``destroy_group(name)`` at the end.

Terms
- group actor: the named, detached coordinator ``hcc-group:<name>`` (actors.py ``GroupImpl``):
  rendezvous of the members' mailboxes, and the store of the group's agreement log, to which it
  appends the deaths Ray reports.
- member mailbox: a small actor owned by each member; it dies with the member, which is how
  the others learn of the death.
"""
from __future__ import annotations

from typing import Any

from .transport import SOCKETS_GROUP, RayTransport, import_ray
from .actors import remote_class

__all__ = ["GroupComm", "destroy_group", "init_group"]

_groups: dict[str, tuple[Any, Any, Any]] = {}  # name -> (mailbox, group actor, comm)


def init_group(world: int, rank: int, group_name: str = "default", *,
               timeout: float = 120.0) -> "GroupComm":
    """Inside one of the user's actors (Ray's collective convention: every member calls it
    with the same ``world`` and ``group_name`` and its own integer ``rank``): returns a
    :class:`RayTransport` for ``hcc.run(plan, comm, array)``. Blocks until all members joined.

    Each member gets a small mailbox actor owned by it (it dies with the member, which is how
    the others learn of the death); the named actor ``hcc-group:<group_name>`` is the
    rendezvous and the coordinator: it serves the store of the group's agreement log and
    appends the deaths Ray reports (see :class:`GroupComm`)."""
    ray = import_ray()
    if not 0 <= rank < world:
        raise ValueError(f"hcc ray: rank {rank} outside 0..{world - 1}")
    mailbox = remote_class("mailbox").options(num_cpus=0, max_concurrency=10000).remote()
    # detached: a named actor is otherwise owned by the member that happened to create it
    # and dies with it, taking the group's agreement log along; destroy_group ends it
    group = remote_class("group").options(name=f"hcc-group:{group_name}", get_if_exists=True,
                                     lifetime="detached", num_cpus=0,
                                     max_concurrency=10000).remote(
                                         world, f"hcc-group:{group_name}")
    size = ray.get(group.size.remote(), timeout=timeout)
    if size != world:
        raise ValueError(f"hcc ray: group {group_name!r} has world {size}, not {world}")
    joined = ray.get(group.join.remote(rank, [mailbox]), timeout=timeout)
    comm = GroupComm(rank, world, joined["handles"], group_name, store=joined["store"],
                     token=joined["token"])
    _groups[group_name] = (mailbox, group, comm)
    return comm


class GroupComm(RayTransport):
    """A :class:`RayTransport` bound to a named group for the group's lifetime: call
    ``hcc.run(plan, comm, array)`` as often as needed (messages match in order, per peer and tag,
    as in MPI). Plans with ``on_failure = continue`` run on the adaptive executor over the
    group actor's agreement log and survive members' deaths; after any other failed call the
    group is unusable: destroy it and create a new one."""

    def __init__(self, rank: int, world: int, handles, group_name: str, *,
                 store: str | None = None, token: str | None = None):
        super().__init__(rank, world, handles, f"hcc-group:{group_name}", store=store,
                         token=token, group=SOCKETS_GROUP)
        self.group_name = group_name

    def close(self) -> None:
        """Nothing per call: the group's session ends in :func:`destroy_group`."""


def destroy_group(group_name: str = "default") -> None:
    """Free this member's mailbox and its handle on the group (Ray's ``destroy_collective_group``)."""
    ray = import_ray()
    member = _groups.pop(group_name, None)
    if member is not None:
        mailbox, group, comm = member
        from ..adaptive import close_session

        close_session(comm)  # its log tail, if a plan ran adaptively
        if comm.store is not None:
            comm.store.close()
        try:
            ray.get(mailbox.close_session.remote(f"hcc-group:{group_name}"), timeout=10)
        except Exception:  # already gone with its actor
            pass
        for actor in (mailbox, group):  # the group actor too, so the name can be used again
            try:
                ray.kill(actor)
            except Exception:  # already gone
                pass
