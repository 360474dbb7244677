"""A device of your own: train the stripes CNN on local data and publish through fedasync.

    custom-model-device --snapshot http://127.0.0.1:8081 --ingest http://127.0.0.1:8084 \\
        --client-id phone-1 --key <the key `fedasync devices add phone-1` printed> --updates 10

Each round: the newest model (a conditional GET: unchanged models are not downloaded again),
local training on a copy of it, one update published through the ingest service (signed with the
device key; the device holds no Redis credentials), and its receipt: what the aggregator decided.
Every receipt is printed and, with --receipts, written as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from custom_model.task import make
from fedasync import Dataset
from fedasync.client import DeviceClient


def local_data(seed: int, share: int, shares: int) -> Dataset:
    """This device's examples: every `shares`-th training example, starting at `share`."""
    train, _ = make().dataset(np.random.default_rng(seed))
    return Dataset(train.X[share::shares], train.y[share::shares])


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    task = make()
    data = local_data(args.seed, args.share, args.shares)
    rng = np.random.default_rng([args.seed, args.share])
    params = task.suggested
    out: list[dict[str, Any]] = []
    async with DeviceClient(
        args.snapshot, args.client_id, key=args.key, ingest_url=args.ingest
    ) as device:
        for _ in range(args.updates):
            model = await device.latest() or await device.wait_newer(-1, timeout=120)
            if model is None or device.training_done:
                break
            weights, metrics = task.train(
                model.weights.copy(),  # the served model is read-only: train a copy
                data,
                rng,
                epochs=params.epochs,
                lr=params.lr,
                batch_size=params.batch_size,
            )
            sent = await device.publish(weights, model.version, len(data.y), metrics)
            receipt = await device.receipt(sent.update_id, wait=args.wait)
            row: dict[str, Any] = {"update_id": sent.update_id, "base_version": model.version}
            if receipt.decision is not None:
                row |= receipt.decision.to_dict()
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snapshot", required=True, help="the snapshot service's base URL")
    parser.add_argument("--ingest", required=True, help="the ingest service's base URL")
    parser.add_argument("--client-id", required=True)
    parser.add_argument(
        "--key", required=True, help="the device key as `fedasync devices add` printed it"
    )
    parser.add_argument("--updates", type=int, default=10, help="rounds to run")
    parser.add_argument("--share", type=int, default=0, help="which share of the data is ours")
    parser.add_argument("--shares", type=int, default=10, help="how many shares there are")
    parser.add_argument("--seed", type=int, default=0, help="the task's data seed")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for a receipt")
    parser.add_argument("--receipts", type=Path, help="write the receipts here, one JSON a line")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args))
    if args.receipts is not None:
        args.receipts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
