"""The chat service: one instance's parts, put together, started and stopped.

- :mod:`.bus` — the NATS connection (typed requests, events, perf records);
- :mod:`.handlers` — what each ``loki.chat.*`` subject does (and its error replies);
- :mod:`.ownership` — which conversations this instance owns; forwarding to the owner;
  the lock keeper;
- :mod:`.actor` — one owned conversation: its queue, worker, events and persistence;
- :mod:`.tasks` — scheduled tasks (their API and the scheduler every instance runs);
- :mod:`.leases` — the engine leases; :mod:`.turn` — the turn loop;
  :mod:`.prewarm` / :mod:`.restart_prewarm` — PREWARM after a compaction / an engine restart;
  :mod:`.compaction` — the default context policy; :mod:`.tools` — the tools offered;
  :mod:`.mcp` — the person's MCP servers (``loki.chat.mcp``) and their tools.

Every display event is published on ``loki.chat.events.<conversation>``: the very objects
appended to the Log, in seq order.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import httpx

from loki_shared import subjects
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest, EngineState
from loki_shared.projects_client import ProjectsClient
from loki_shared.serve import serve

from .actor import Actor, Shared
from .bus import ChatBus
from .code.workspace import WorkspaceClient
from .compaction import CompactionDeps, CompactionPolicy
from .context import ContextPolicy
from .engine import EngineClient
from .handlers import ChatHandlers
from .image_shelf import ImageShelf
from .leases import EngineLeases
from .mcp import McpApi, McpManager, Registry
from .ownership import Ownership
from .project.head import ProjectHead
from .project.memory_link import active_project_id, block_fetch, memory_call
from .restart_prewarm import RestartPrewarm
from .settings import Settings
from .store import Store
from .subagent import run_subagent
from .tasks.api import TasksApi
from .tasks.scheduler import Scheduler
from .tasks.store import TaskStore
from .tokens import Engine, TokenCounts
from .tools import ToolBox, ToolSpec, default_toolbox
from .tools.box import CallContext
from .tools.subagent import subagent_tool


class ChatService:
    """One chat instance: its owners of conversations, NATS handlers, engine and recall
    clients.

    Args:
        settings: the service settings.
        broker: a FastStream ``NatsBroker`` (handlers are registered by :meth:`register`).
        store: the Redis store (it knows this instance's id).
        http: the shared ``httpx.AsyncClient`` for the engine.
        toolbox: tools offered to the model (default: :func:`~loki_chat.tools.default_toolbox`).
        policy: the compaction seam (default :class:`~loki_chat.compaction.CompactionPolicy`;
            :class:`~loki_chat.context.NoCompaction` never compacts).

    The request handlers (``send``, ``control``, ``state``, ``replay``, ``conversations``)
    are also callable in process, with the request model, as the subjects serve them.
    """

    def __init__(
        self,
        settings: Settings,
        broker: Any,
        store: Store,
        http: httpx.AsyncClient,
        toolbox: ToolBox | None = None,
        policy: ContextPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.bus = ChatBus(broker)
        self.store = store
        self.instance = store.instance
        self.http = http
        self.request = self.bus.request
        shelf = ImageShelf(store.r, store.sealer)
        #: the memory service (project block, memory tools)
        self.projects = ProjectsClient.from_broker(broker, settings.memory_timeout_s)
        self.shared = Shared(
            settings=settings,
            store=store,
            bus=self.bus,
            leases=EngineLeases(self.bus, settings, self.instance),
            engine=EngineClient(http, settings.retry_delays, settings.engine_timeout_s),
            toolbox=toolbox
            or default_toolbox(self.bus, settings, shelf, memory_call(self.projects)),
            shelf=shelf,
            policy=policy or CompactionPolicy(CompactionDeps(settings, self.bus, http)),
            tokens=(
                TokenCounts(http, settings.tokenize_timeout_s, self._locate_engine)
                if settings.tokenize_timeout_s > 0
                else None
            ),
            project=ProjectHead(
                fetch=block_fetch(self.projects),
                active=active_project_id(self.projects),
                active_wait_s=settings.memory_active_wait_s,
                enabled=settings.proj_snapshot,
                max_updates=settings.proj_snapshot_max_updates,
                boot=uuid.uuid4().hex,  # a new start token per process: a restart retakes
            ),
        )
        if toolbox is None:  # recall, recall_search, then subagent (the order never changes)
            self.shared.toolbox.add(self.subagent_tool())
        #: the person's MCP servers (:mod:`loki_chat.mcp`): their tools follow the built-ins
        self.mcp = McpManager(
            Registry(store.r, store.sealer), settings.home, settings.mcp_timeout_s
        )
        self.shared.mcp = self.mcp
        #: the workspace service (code mode: :mod:`loki_chat.code`)
        self.shared.workspace = WorkspaceClient(self.bus.request, settings.workspace_timeout_s)
        self.shared.project.agents = self.shared.workspace.agents_md
        self.mcp_api = McpApi(self.mcp)
        self.tasks = TaskStore(store.r, store.sealer)
        self.shared.tasks = self.tasks
        self.ownership = Ownership(self.shared)
        self.handlers = ChatHandlers(self.shared, self.ownership)
        #: PREWARM after an engine restart (``loki.engine.state`` ``ready`` events)
        self.restart_prewarm = RestartPrewarm(self.shared, self.ownership.take)
        self.tasks_api = TasksApi(self.tasks)
        self.scheduler = Scheduler(settings, self.tasks, self.ownership, self.instance)
        self.send = self.handlers.send
        self.control = self.handlers.control
        self.state = self.handlers.state
        self.replay = self.handlers.replay
        self.conversations = self.handlers.conversations
        self.code = self.handlers.code

    async def _locate_engine(self) -> Engine | None:
        """The local engine that counts tokens (``loki.engine.info``; None when external,
        not ready or unknown)."""
        info = await self.bus.request(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo, 2.0)
        if info.external or info.state != "ready" or not info.base_url:
            return None
        return Engine(info.base_url, info.api_key, info.model)

    def subagent_tool(self) -> ToolSpec:
        """The ``subagent`` tool bound to this instance (:mod:`loki_chat.subagent`)."""
        shared = self.shared

        async def run(args: dict[str, Any], call: CallContext) -> str:
            return await run_subagent(shared, args, call)

        return subagent_tool(run)

    @property
    def toolbox(self) -> ToolBox:
        """The tools offered to the model (replaceable before the first turn)."""
        return self.shared.toolbox

    @toolbox.setter
    def toolbox(self, box: ToolBox) -> None:
        self.shared.toolbox = box

    @property
    def policy(self) -> ContextPolicy:
        return self.shared.policy

    @property
    def actors(self) -> dict[str, Actor]:
        """The conversations this instance owns now, by id."""
        return self.ownership.actors

    def register(self) -> None:
        """Declare the subscribers on the broker (before it starts)."""
        self.handlers.register(self.broker)

        q = subjects.QUEUE_CHAT
        serve(self.broker, subjects.CHAT_TASKS, self.tasks_api.handle, queue=q, max_workers=8)
        serve(self.broker, subjects.CHAT_MCP, self.mcp_api.handle, queue=q, max_workers=4)

        @self.broker.subscriber(subjects.ENGINE_STATE)  # every instance: no queue group
        async def on_engine_state(msg: EngineState) -> None:
            if not self.shared.closing:
                await self.restart_prewarm.on_state(msg)

    async def start(self) -> None:
        """After ``broker.start()``: make sure the server has our subscriptions (so a
        request sent right after gets an answer), then start the lock keeper."""
        connection = self.bus.connection
        if connection is not None:
            # NATS slow or away: the start goes on, the requests find the subscriptions later
            with contextlib.suppress(Exception):
                await connection.flush(timeout=5)
        self.ownership.start()
        self.scheduler.start()

    async def close(self) -> None:
        """Claim no more task due times and give the started task runs up to 3 s, stop every
        turn (partial replies kept and persisted), release the locks, wait briefly for the
        perf records still being published."""
        await self.scheduler.close(timeout=3.0)  # no new claim; started runs may finish
        self.shared.closing = True
        self.shared.leases.closing = True  # partial replies are persisted before releases
        await self.ownership.close()
        await self.scheduler.close(timeout=1.0)  # the runs stopped now record how they ended
        await self.mcp.close()  # stdio servers' processes end
        await self.bus.drain(timeout=3)


def instance_id(settings: Settings) -> str:
    """This instance's id (``LOKI_INSTANCE_ID`` or random; a valid subject token)."""
    return settings.instance_id or uuid.uuid4().hex[:12]
