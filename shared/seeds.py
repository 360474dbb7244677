"""One seed, many independent streams: numpy SeedSequence children named by a fixed key.

`SeedSequence(seed, spawn_key=key)` is exactly the child that `spawn` would produce, but needs no
state, so the k-th run of device d gets the same generator in every algorithm and in any order
of events. That is what makes FedAsync, FedBuff and FedAvg run on *the same* fleet.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    DATA = 0
    PARTITION = 1
    FLEET = 2
    MODEL = 3
    SERVER = 4
    DEVICE = 5
    #: the server's held-out set (Zeno++'s validation gradient)
    VALIDATION = 6
    #: which devices are malicious (sim/attacks.py)
    ATTACK = 7


class DeviceStream(IntEnum):
    LATENCY = 0
    AVAILABILITY = 1
    TRAIN = 2
    #: a malicious device's own draws: its noise, its poisoned samples
    ATTACK = 3


def stream(seed: int, *key: int) -> np.random.Generator:
    """The generator for one purpose; the same (seed, key) always gives the same draws."""
    return np.random.Generator(bits(seed, *key))


def bits(seed: int, *key: int) -> np.random.PCG64:
    """The bit generator under `stream(seed, *key)`, without a Generator around it (cheaper,
    for code that keeps only its state)."""
    return np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key))


def device_stream(seed: int, device: int, kind: DeviceStream, *more: int) -> np.random.Generator:
    """A device's own generator for latencies, availability, or one run's training."""
    return stream(seed, Stream.DEVICE, device, kind, *more)


def simulated_dp_secret(seed: int) -> bytes:
    """The DP noise secret of a simulation with `seed` (shared/privacy/noise.py): derived from
    the seed, so a simulation with DP reproduces from its config, where the aggregator keeps a
    random per-run secret."""
    return hashlib.sha256(f"fedasync-sim-dp/{seed}".encode()).digest()


#: numpy's SeedSequence constants (numpy/random/bit_generator.pyx), for `pcg64_starts`
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4
#: PCG64's multiplier (numpy/random/src/pcg64/pcg64.h), and 2^128 − 1
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_MASK128 = (1 << 128) - 1


def _words(value: int) -> list[int]:
    """An int as numpy's SeedSequence reads it: 32-bit words, least significant first."""
    words = [value & 0xFFFFFFFF]
    value >>= 32
    while value:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
    return words


class PCG64Starts:
    """The starting PCG64 (state, increment) of `bits(seed, *prefix, i, *suffix)` for every
    i below `count`, computed for all of them at once.

    Made one at a time, each costs a SeedSequence and a PCG64 (about 50 µs): 5 s for the
    latency streams of 100,000 devices (issue 29). This is numpy's SeedSequence hashing and
    PCG64's seeding, the same arithmetic on arrays (4 words per device are kept, 32 bytes);
    the first and the last device are checked against numpy itself when the table is made, so
    a numpy that seeds otherwise fails loudly instead of drawing other streams.
    """

    def __init__(
        self, seed: int, prefix: tuple[int, ...], count: int, suffix: tuple[int, ...]
    ) -> None:
        run = _words(seed)
        run += [0] * (_POOL - len(run))  # a spawn key pads the seed's words to the pool size
        columns: list[np.ndarray | int] = [*run]
        for k in prefix:
            columns += _words(k)
        if count > 1 << 32:
            raise ValueError("at most 2^32 streams in one table")  # one word per index
        columns.append(np.arange(count, dtype=np.uint64))
        for k in suffix:
            columns += _words(k)
        with np.errstate(over="ignore"):
            entropy = [np.full(count, c, np.uint64) if isinstance(c, int) else c for c in columns]
            pool = self._mix(entropy)
            words = self._generate(pool)
        #: generate_state(4, uint64): the words paired little-endian, 32 bytes per stream
        self._seeds = np.stack(
            [words[k] | words[k + 1] << np.uint64(32) for k in range(0, 8, 2)], axis=1
        )
        for index in {0, count - 1}:
            expected = bits(seed, *prefix, index, *suffix).state["state"]
            if self.start(index) != (expected["state"], expected["inc"]):
                raise AssertionError("numpy's SeedSequence or PCG64 seeding has changed")

    @staticmethod
    def _hashmix(value: np.ndarray, hash_const: list[int]) -> np.ndarray:
        value = (value ^ hash_const[0]) & 0xFFFFFFFF
        hash_const[0] = (hash_const[0] * _MULT_A) & 0xFFFFFFFF
        value = (value * hash_const[0]) & 0xFFFFFFFF
        return value ^ (value >> 16)

    @staticmethod
    def _mix(entropy: list[np.ndarray]) -> list[np.ndarray]:
        hash_const = [_INIT_A]
        zero = np.zeros_like(entropy[0])
        pool = [
            PCG64Starts._hashmix(entropy[i] if i < len(entropy) else zero, hash_const)
            for i in range(_POOL)
        ]

        def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            result: np.ndarray = (_MIX_L * x - _MIX_R * y) & 0xFFFFFFFF
            mixed: np.ndarray = result ^ (result >> 16)
            return mixed

        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = mix(pool[dst], PCG64Starts._hashmix(pool[src], hash_const))
        for src in range(_POOL, len(entropy)):
            for dst in range(_POOL):
                pool[dst] = mix(pool[dst], PCG64Starts._hashmix(entropy[src], hash_const))
        return pool

    @staticmethod
    def _generate(pool: list[np.ndarray]) -> list[np.ndarray]:
        """`generate_state(4, uint64)` as 8 uint32 words, in order."""
        hash_const = _INIT_B
        out = []
        for i in range(8):
            value = (pool[i % _POOL] ^ hash_const) & 0xFFFFFFFF
            hash_const = (hash_const * _MULT_B) & 0xFFFFFFFF
            value = (value * hash_const) & 0xFFFFFFFF
            out.append(value ^ (value >> 16))
        return out

    def start(self, index: int) -> tuple[int, int]:
        """(state, inc) of stream `index`, as `bits(...).state["state"]` reports them."""
        seed = self._seeds[index].tolist()  # PCG64 seeds from state[0:2], increments [2:4]
        initstate, initseq = seed[0] << 64 | seed[1], seed[2] << 64 | seed[3]
        inc = (initseq << 1 | 1) & _MASK128  # pcg_setseq_128_srandom_r
        state = inc  # 0 · MULT + inc
        state = (state + initstate) & _MASK128
        state = (state * _PCG_MULT + inc) & _MASK128
        return state, inc
