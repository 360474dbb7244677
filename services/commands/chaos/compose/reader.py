"""What a compose chaos run reads from the stack's Redis, from inside the compose network.

The compose Redis publishes no port, and no user may read everything. So the run reads it the
way an operator does, through the `fedasync` tools service, as the admin user (whose rights are
reading the ledger, the updates stream and the models, and ACL LOG):

    docker compose run --rm -T --entrypoint python fedasync \
        -m fedasync.services.commands.chaos.compose.reader

prints one JSON object: every ledger record (the fields the exactly-once check takes), the
updates stream's entry ids, the `ledger verify` report, the commands Redis's ACL refused since its
last start, and the committed version with its model's sha256. The control service reports the
rest (dead letters, alerts) over its published port; the workers' journals come out of their
containers (chaos/compose/run.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from typing import Any

from fedasync.services.commands.chaos.audit import entry_ids, refusals
from fedasync.services.runtime.redis_conn import connect, get_bytes
from fedasync.services.runtime.settings import load_settings
from fedasync.services.stores.ledger import records, verify
from fedasync.shared.keys import Keys

#: the fields of a ledger record the exactly-once check reads (stores/exactly_once.py, Decided)
DECIDED_FIELDS = ("update_id", "outcome", "version", "stream_id", "server_step")


async def read() -> dict[str, Any]:
    settings = load_settings()
    if settings.redis.url is None:
        raise SystemExit("compose reader: FEDASYNC_REDIS__URL is not set (run it as `fedasync`)")
    # the service's own Redis settings (Sentinels and all: under the `ha` profile the primary
    # is wherever they say), with a socket timeout long enough for the whole ledger's reads
    redis_settings = settings.redis.model_copy(update={"socket_timeout_s": 30.0})
    keys = Keys(redis_settings.key_prefix)
    client = connect(redis_settings)
    try:
        ledger = [
            {k: record[k] for k in DECIDED_FIELDS if k in record}
            async for record in records(client, keys)
        ]
        report = await verify(client, keys, settings.wire.max_message_bytes)
        version = int(await get_bytes(client, keys.version) or 0)
        model = await get_bytes(client, keys.model(version)) or b""
        return {
            "records": ledger,
            "entry_ids": await entry_ids(client, keys.updates),
            "verify": {
                "ok": report.ok,
                "replayed": report.replayed,
                "version": report.version,
                "text": report.describe(),
            },
            "acl_refusals": await refusals(client),
            "committed": {
                "version": version,
                "sha256": hashlib.sha256(model).hexdigest() if model else "",
            },
        }
    finally:
        await client.aclose()


def main() -> int:
    json.dump(asyncio.run(read()), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
