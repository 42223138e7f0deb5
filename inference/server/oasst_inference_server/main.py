"""Build the FastAPI application: settings, database, broker, routers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from loguru import logger

from oasst_inference_server.admission.prompt_fit import PromptFit
from oasst_inference_server.anthropic_api.anthropic_service import AnthropicService
from oasst_inference_server.anthropic_api.serving import AnthropicServing
from oasst_inference_server.api.edge_guard import EdgeGuard
from oasst_inference_server.api.error_handlers import install_error_handlers
from oasst_inference_server.api.responses import document_errors
from oasst_inference_server.api.routes import (
    account,
    admin,
    admin_aliases,
    admin_export,
    admin_limits,
    admin_moderation,
    admin_users,
    anthropic,
    api_keys,
    auth,
    chat_management,
    chats,
    configs,
    health,
    metrics,
    moderations,
    openai,
    responses,
    scoring,
    tokenizing,
    usage,
    web,
    workers,
)
from oasst_inference_server.auth.user_cache import UserCache
from oasst_inference_server.broker import create_broker
from oasst_inference_server.db.driver import driver_connections
from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.db.migrations import upgrade_to_head
from oasst_inference_server.dispatch.answer_ends import AnswerEnds
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.dispatch.recovery import RecoveryLoop
from oasst_inference_server.fleet.on_demand import OnDemandLoads
from oasst_inference_server.fleet.switcher import ModelSwitcher
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.moderation.word_list import WordList
from oasst_inference_server.openai_api.moderation_embedder import ModerationEmbedder
from oasst_inference_server.openai_api.openai_service import OpenAIService
from oasst_inference_server.openai_api.serving_chat import ChatCompletionServing
from oasst_inference_server.openai_api.serving_completions import CompletionServing
from oasst_inference_server.openai_api.serving_embeddings import EmbeddingServing
from oasst_inference_server.openai_api.serving_models import ModelServing
from oasst_inference_server.openai_api.serving_moderations import ModerationServing
from oasst_inference_server.openai_api.serving_scoring import ScoringServing
from oasst_inference_server.openai_api.serving_tokenize import TokenizeServing
from oasst_inference_server.quotas.charging import UsageCharger
from oasst_inference_server.quotas.gate import QuotaGate
from oasst_inference_server.quotas.prices import Prices
from oasst_inference_server.responses_api.service import ResponsesService
from oasst_inference_server.responses_api.serving import ResponsesServing
from oasst_inference_server.routing.alias_admin import AliasAdmin, file_alias_entries
from oasst_inference_server.routing.alias_table import AliasTable
from oasst_inference_server.routing.router import ModelRouter
from oasst_inference_server.scheduling.dispatcher import Dispatchers
from oasst_inference_server.scheduling.handoff import Handoff
from oasst_inference_server.scheduling.rebalancer import Rebalancer
from oasst_inference_server.scheduling.rebalancer_snapshot import DatabaseDemand
from oasst_inference_server.scheduling.worker_registry import WorkerRegistry
from oasst_inference_server.settings import Settings, get_settings
from oasst_inference_server.streams.fanout import StreamFanout
from oasst_inference_server.streams.message_reads import MessageReads
from oasst_inference_server.submission import SubmissionService
from oasst_inference_server.workers.compliance import ComplianceChecker
from oasst_inference_server.workers.compliance_store import ComplianceRecorder
from oasst_inference_server.workers.prompt_sizes import PromptSizes
from oasst_inference_server.workers.remote_questions import RemoteQuestions
from oasst_shared.model_registry import load_registry


def _build_serving(app: FastAPI, prompt_sizes: PromptSizes) -> None:
    """One serving object per API endpoint, on the services the lifespan built (``api.deps`` reaches them)."""
    openai_service = app.state.openai_service
    app.state.model_serving = ModelServing(openai_service, app.state.quota_gate)
    app.state.chat_serving = ChatCompletionServing(openai_service)
    app.state.completion_serving = CompletionServing(openai_service)
    app.state.embedding_serving = EmbeddingServing(openai_service)
    app.state.scoring_serving = ScoringServing(openai_service)
    app.state.tokenize_serving = TokenizeServing(openai_service, prompt_sizes)
    app.state.responses_serving = ResponsesServing(app.state.responses_service)
    app.state.anthropic_serving = AnthropicServing(app.state.anthropic_service)
    app.state.moderation_serving = ModerationServing(openai_service, app.state.moderation)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    # The operator's model configs, checked before anything starts (ModelRegistryError names each bad field).
    model_registry = load_registry(settings.model_configs_dir)
    # The moderation hook's lists are compiled now: a bad entry (UnsafePattern) fails the start.
    moderation_lists = WordList(settings.moderation_word_lists)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_engine(settings)
        await upgrade_to_head(engine, startup_timeout=settings.database_startup_timeout)
        broker = create_broker(
            settings.broker_url,
            key_prefix=settings.redis_key_prefix,
            stream_ttl=settings.stream_ttl_seconds,
            stream_maxlen=settings.stream_maxlen,
            max_connections=settings.redis_max_connections,
            stream_idle_ttl=settings.stream_idle_ttl_seconds,
            fair_credit=settings.fair_queue_credit_tokens,
        )
        await broker.start()
        session_factory = make_session_factory(engine)
        moderation = Moderation(settings, session_factory, moderation_lists)
        app.state.settings = settings
        app.state.engine = engine
        app.state.session_factory = session_factory
        app.state.broker = broker
        # One broker read per message stream in this process, shared by all its SSE readers.
        app.state.stream_fanout = fanout = StreamFanout(broker)
        app.state.user_cache = UserCache(settings.user_cache_seconds, settings.user_cache_size)
        app.state.model_registry = model_registry
        app.state.registry = WorkerRegistry(
            broker, known=model_registry, on_demand=settings.on_demand_loading
        )
        # Load and unload commands to worker sockets on any replica; loads on demand, idle unloads.
        app.state.model_switcher = switcher = ModelSwitcher(broker, app.state.registry.sessions, settings)
        app.state.on_demand_loads = loads = OnDemandLoads(
            broker, app.state.registry.sessions, switcher, settings
        )
        # The pongs' lease extensions on a connection of their own: requests and readers that take every
        # connection of the pool must not make leases expire. (SQLite: one engine, one database file.)
        lease_engine = engine if engine.dialect.name == "sqlite" else create_engine(settings, connections=1)
        app.state.lifecycle = MessageLifecycle(
            session_factory,
            broker,
            settings,
            lease_sessions=make_session_factory(lease_engine),
        )
        # Answers' ends in SQL of their own (Postgres), on connections of their own: a burst of ends waits
        # for these (long, rather than lose a result), and the requests' pool does not wait for them.
        answer_engine = (
            engine
            if engine.dialect.name == "sqlite"
            else create_engine(settings, connections=settings.database_answer_connections, pool_timeout=300)
        )
        app.state.answer_engine = answer_engine
        answer_driver = driver_connections(answer_engine)
        if answer_driver is not None:
            app.state.lifecycle.answer_ends = AnswerEnds(answer_driver, settings.database_answer_connections)
        # What event readers ask besides the stream (state checks, queue positions), read-only. The silent
        # streams' state checks on connections of their own: held streams must not take the connections
        # of the requests that open new ones (one batched read at a time needs no more than two).
        state_check_engine = (
            engine if engine.dialect.name == "sqlite" else create_engine(settings, connections=2)
        )
        app.state.state_check_engine = state_check_engine
        app.state.message_reads = MessageReads(
            session_factory,
            broker,
            app.state.registry.sessions,
            state_check_sessions=make_session_factory(state_check_engine),
        )
        app.state.dispatchers = Dispatchers(
            broker, app.state.lifecycle, trusted_only_tiers=bool(settings.trusted_workers_only_tiers)
        )
        app.state.compliance = ComplianceRecorder(session_factory, broker, settings.compliance_fail_threshold)
        checker = app.state.compliance_checker = ComplianceChecker(
            settings, app.state.dispatchers, app.state.compliance
        )
        checker_task = asyncio.create_task(checker.run(), name="compliance checks")
        handoff = Handoff(app.state.dispatchers, broker, settings) if settings.hand_over_at_once else None
        # Prompts are sized by counting workers (the model's own tokenizer), this process's first.
        app.state.remote_questions = remote_questions = RemoteQuestions(broker)
        prompt_sizes = PromptSizes(
            app.state.dispatchers,
            timeout=settings.prompt_count_timeout,
            sessions=app.state.registry.sessions,
            remote=remote_questions,
        )
        prompt_fit = PromptFit(prompt_sizes)
        # Keys' and users' usage limits: checked at admission, charged when generations end.
        prices = Prices(model_registry)
        app.state.quota_gate = quotas = QuotaGate(broker, prices)
        app.state.lifecycle.usage_charger = UsageCharger(broker, prices, session_factory)
        # Aliases and fallbacks: the files' and the stored ones, changes seen at once on every replica.
        aliases = AliasTable(
            session_factory, broker, file_alias_entries(model_registry), settings.alias_cache_seconds
        )
        router = ModelRouter(
            app.state.registry,
            aliases,
            broker,
            model_registry,
            settings.fallback_queue_length or settings.max_queue_size,
        )
        app.state.alias_admin = AliasAdmin(
            session_factory, broker, model_registry, fleet=app.state.registry.fleet_configs
        )
        app.state.moderation = moderation
        app.state.submission = SubmissionService(
            settings,
            app.state.lifecycle,
            app.state.registry,
            handoff,
            prompt_fit,
            loads,
            quotas=quotas,
            router=router,
            moderation=moderation,
        )
        app.state.openai_service = OpenAIService(
            settings,
            session_factory,
            fanout,
            app.state.message_reads,
            app.state.lifecycle,
            app.state.registry,
            app.state.submission,
        )
        app.state.responses_service = ResponsesService(
            settings, session_factory, app.state.lifecycle, app.state.openai_service
        )
        if settings.moderation_classifier_model:  # the classifier's embeddings, from the fleet
            moderation.classifier.embedder = ModerationEmbedder(
                app.state.openai_service, session_factory, settings.moderation_classifier_model
            )
        app.state.anthropic_service = AnthropicService(app.state.openai_service, prompt_sizes)
        _build_serving(app, prompt_sizes)
        recovery = RecoveryLoop(session_factory, broker, app.state.lifecycle, app.state.registry, settings)
        recovery_task = asyncio.create_task(recovery.run(), name="recovery")
        fleet_task = asyncio.create_task(loads.run(), name="fleet pass")
        # Workers move between models as demand moves (one replica at a time; off at interval 0).
        app.state.rebalancer = rebalancer = Rebalancer(
            broker, DatabaseDemand(session_factory), settings, switcher
        )
        rebalancer_task = asyncio.create_task(rebalancer.run(), name="rebalancer")
        logger.info(
            "inference server ready ({} mode, broker {})",
            settings.environment,
            "redis" if settings.broker_url and settings.broker_url.startswith("redis") else "in-process",
        )
        try:
            yield
        finally:
            recovery.stopping.set()
            recovery_task.cancel()
            rebalancer.stopping.set()
            rebalancer_task.cancel()
            await asyncio.wait([rebalancer_task], timeout=3.0)
            await rebalancer.stop()
            await loads.stop()
            fleet_task.cancel()
            await asyncio.wait([fleet_task], timeout=3.0)
            await switcher.close()
            checker_task.cancel()
            await asyncio.wait([checker_task], timeout=3.0)
            # Bounded: a broker call that swallows the cancellation must not hang the shutdown.
            await asyncio.wait([recovery_task], timeout=3.0)
            await recovery.stop()
            await remote_questions.close()
            await app.state.lifecycle.leases.close()
            if app.state.lifecycle.answer_ends is not None:
                await app.state.lifecycle.answer_ends.close()
            await app.state.message_reads.close()
            for own_engine in (lease_engine, state_check_engine, answer_engine):
                if own_engine is not engine:
                    await own_engine.dispose()
            await fanout.close()
            await broker.close()
            await engine.dispose()

    docs = bool(settings.docs_enabled)
    app = FastAPI(
        title="Open-Assistant inference server",
        version="0.1.0",
        lifespan=lifespan,
        description="Chats with streamed answers from a fleet of text-generation workers.",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    install_error_handlers(app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            # A wildcard origin never carries credentials (production refuses the wildcard).
            allow_credentials="*" not in settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )
    # Outermost: bodies are bounded and checked before CORS, authentication or parsing.
    app.add_middleware(
        EdgeGuard, max_body_bytes=settings.max_request_body_bytes, body_timeout=settings.request_body_timeout
    )
    if settings.metrics_enabled:
        app.include_router(metrics.router)
    # chat_management before chats: its /chats/hide_all must win over /chats/{chat_id}.
    for module in (
        health,
        auth,
        account,
        chat_management,
        chats,
        configs,
        workers,
        admin,
        admin_aliases,
        admin_export,
        admin_limits,
        admin_moderation,
        admin_users,
        api_keys,
        usage,
        openai,
        moderations,
        responses,
        anthropic,
        scoring,
        tokenizing,
        web,
    ):
        app.include_router(module.router)
    web.mount_static(app)
    document_errors(app)
    return app
