"""Per-user client settings: read with defaults, replace whole, bounded in size."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db.models import DbUserSettings, utcnow
from oasst_inference_server.db.stored_json import read_stored
from oasst_inference_server.domain_errors import InvalidValue
from oasst_shared.schemas import UserSettings

# The schema bounds every field but the texts inside lists (stop sequences): this bounds the whole.
MAX_SETTINGS_BYTES = 8192


async def load_user_settings(session: AsyncSession, user_id: str) -> UserSettings:
    row = await session.get(DbUserSettings, user_id)
    stored = read_stored(UserSettings, row.settings, what=f"settings of user {user_id}") if row else None
    return stored or UserSettings()


async def save_user_settings(session: AsyncSession, user_id: str, settings: UserSettings) -> UserSettings:
    data = settings.model_dump(mode="json")
    if len(settings.model_dump_json()) > MAX_SETTINGS_BYTES:
        raise InvalidValue("settings_too_large", f"settings are limited to {MAX_SETTINGS_BYTES} bytes")
    row = await session.get(DbUserSettings, user_id)
    if row is None:
        row = DbUserSettings(user_id=user_id, settings=data)
    else:
        row.settings = data
        row.updated_at = utcnow()
    session.add(row)
    await session.commit()
    return settings
