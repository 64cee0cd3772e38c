"""hcc.backends.ray — the ``ray`` backend: Ray actors for placement, rendezvous and failure
detection; plan data over Ray's object store or over the sockets transport.

Terms
- *rank actor*: one Ray actor per rank (:class:`ActorGroup` makes them); it runs the executor
  for its rank in a worker thread while its asyncio loop serves its *mailbox*.
- *mailbox*: the async actor methods ``put``/``take``/``watch``/``close_session`` (the
  :class:`_MailboxCore` mixin) through which the object-store transport delivers messages: the
  sender ``ray.put``s the bytes and posts ``[ref]`` to the receiver's mailbox; the receiver's
  pending ``take`` returns the boxed ref, whose object it copies into the destination slice.
  Rank actors are their own mailboxes; a user's actors (:func:`init_group`) get a small
  mailbox actor each.
- *session*: one :meth:`ActorGroup.run` call on the sockets path (all its iterations share
  one sockets transport and one agreement session); one iteration on the object-store path.
  Tags repeat between iterations, so an object-store message is keyed ``(session, src, tag,
  seq)``, ``seq`` counting the messages of that ``(src, tag)``.
- *data path*: ``"objects"`` (the object store, :class:`RayTransport`) or ``"sockets"``
  (``hcc.backends.sockets.connect`` between the actors, authenticated by a per-run token and
  watched by Ray for deaths), the default: 3-13x faster than the object store on a 16 MiB
  broadcast over 4 actors (docs/ray.md).
- *coordinator*: the driver's side of a sockets-path call (:class:`_Coordinator`): it serves
  the rendezvous store, and in it the agreement log of backends/agreement.py, outside every
  rank, so the death of any rank (rank 0 included) is survivable.

Failure detection is Ray's: every transport holds, per peer, a pending ``watch`` call on the
peer's mailbox. When a peer actor dies, Ray fails that call with ``ActorDiedError`` and the
transport raises :class:`~hcc.backends.base.PeerFailed` from ``wait_any`` at once — survivors do
not wait for their deadline. The driver (:meth:`ActorGroup.run`) sees the dead actor's own call
fail the same way (measured: 8–10 ms after the SIGKILL on this machine) and raises
:class:`~hcc.backends.base.RankFailed` naming it.

Surviving deaths (``on_failure = continue``, sockets path): the rank actors run the adaptive
runtime (backends/adaptive/), which needs a transport that declares ``agreement`` — the
watched sockets transport hands on the driver's store. Agreement on who died: the driver
appends ``dead(r)`` to the log as soon as Ray fails rank r's step (``EventLog.report_dead``,
which keeps one event per death however many reporters); each rank also reports the deaths its
own transport sees (an EOF on a connection: microseconds after a SIGKILL; or a watch Ray
failed). Every survivor folds the same log, so all repair the same trees; the driver returns
``None`` for the dead ranks and the survivors' outputs with ``contributors``/``missing``. A
rank that died before it published its address gets a refusing one from the driver, so the
others' ``connect`` does not wait for it.

Loopback only: Ray binds its servers to the node address, and resolves ``127.0.0.1`` to the
machine's external address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (ray_constants
``ENABLE_RAY_CLUSTER``) — measured with ``ss -ltn``: without it the GCS, raylet and workers
listened on ``*`` and the agents on eth0; with it, only on 127.0.0.1. :func:`local_cluster`
sets it before Ray is imported.

Modules (imports go one way, down this list): ``transport.py`` (the object-store transport and
the mailbox), ``watched.py`` (the sockets path with Ray's death notices), ``actors.py`` (rank,
mailbox and group actors), ``driver.py`` (:class:`ActorGroup`, ``run``, ``run_local``),
``group.py`` (``init_group``/``destroy_group`` for a user's own actors). Ray is imported on
first use: ``pip install 'hcc[ray]'``.
"""
from __future__ import annotations

from .driver import ActorGroup, RunReport, run, run_local
from .group import GroupComm, destroy_group, init_group
from .transport import DATA_PATHS, RayTransport, available, local_cluster

__all__ = [
    "ActorGroup", "DATA_PATHS", "GroupComm", "RayTransport", "RunReport", "available", "destroy_group",
    "init_group", "local_cluster", "run", "run_local",
]
