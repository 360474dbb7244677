"""Named configurations that test the write-up's claims, kept as TOML text.

TOML rather than Python so that `fedasync simulate --show-config` prints a file a user can copy
and edit; kept inside this module so that an installed package always has them. Each preset's
numbers are documented in docs/experiments.md. Local training follows the write-up's example
(5 local epochs would be its default; 2 epochs of batches of 8 keep a full preset run within a
few minutes on 2 cores); times are simulated.
"""

from __future__ import annotations

import tomllib
from typing import Any

_FLEET = """
[fleet]
devices = 100
latency = { kind = "longtail", jitter = 0.2 }
"""

_DIGITS = """
[task]
name = "digits"
params = { hidden = 32 }

[training]
epochs = 2
lr = 0.1
batch_size = 8
"""

PRESETS: dict[str, str] = {
    "iid-longtail": f'''
name = "iid-longtail"
description = """Write-up section 1.2: 100 devices on the long-tail mixture, IID digits. Does
FedAsync reach the target accuracy in under half of synchronous FedAvg's simulated time? FedAvg
waits for all 100 devices each round; FedAsync runs with the default tau_max = 10 and with the
advisor's."""
{_DIGITS}
[data]
partition = "iid"
{_FLEET}
[budget]
max_updates = 12000
max_seconds = 86400

[eval]
interval_s = 60
target = 0.9

[[algorithms]]
kind = "fedavg"
name = "fedavg-all"
clients_per_round = 100

[[algorithms]]
kind = "fedasync"
name = "fedasync-tau10"
tau_max = 10

[[algorithms]]
kind = "fedasync"
name = "fedasync-advised"
tau_max = "auto"
''',
    "noniid-jitter": f'''
name = "noniid-jitter"
description = """Write-up section 2.4: class-extreme split (2 classes per device). Jitter of
FedAsync with gamma = 0.5, tau_max = 20 against gamma = 0.8, tau_max = 8. At most 10 devices
train at once, so that tau lives in the range these tau_max values were meant for."""
{_DIGITS}
[data]
partition = "shards"
classes_per_device = 2
{_FLEET}max_concurrency = 10

[budget]
max_updates = 20000
max_seconds = 21600

[eval]
interval_s = 60
target = 0.8
jitter_window = 60

[[algorithms]]
kind = "fedasync"
name = "gamma0.5-tau20"
gamma = 0.5
tau_max = 20

[[algorithms]]
kind = "fedasync"
name = "gamma0.8-tau8"
gamma = 0.8
tau_max = 8
''',
    "rare-class-dropped": f'''
name = "rare-class-dropped"
description = """Write-up section 4.2: class 8 is held only by the slowest 10% of devices (all of
its samples; with 30% of them no algorithm learned class 8 within the budget, see
docs/experiments.md). With too small a tau_max their updates are always dropped: compare class
8's accuracy with the others', and the per-client acceptance that reveals it."""
{_DIGITS}
[data]
partition = "rare_class_on_slow"
rare_class = 8
rare_keep = 1.0
slow_share = 0.1
{_FLEET}
[budget]
max_updates = 100000
max_seconds = 10800

[eval]
interval_s = 60
target = 0.9

[[algorithms]]
kind = "fedasync"
name = "fedasync-tau10"
tau_max = 10

[[algorithms]]
kind = "fedasync"
name = "fedasync-advised"
tau_max = "auto"

[[algorithms]]
kind = "fedasync"
name = "fedasync-tau1000"
tau_max = 1000

# diagnostic: no staleness discount at all, so a slow device's update weighs as much as any
[[algorithms]]
kind = "fedasync"
name = "constant-tau1000"
decay = "constant"
tau_max = 1000

[[algorithms]]
kind = "fedavg"
name = "fedavg-all"
clients_per_round = 100
''',
    "rare-class-fair": f'''
name = "rare-class-fair"
description = """Issue 14: an asynchronous mode that does not forget the slow devices' rare
class. The write-up's long-tail fleet, class 8 only on the slowest 10% of devices (as in
rare-class-dropped), three simulated hours. FedAvg (all 100 per round, and 10 of 13 with
over-selection), FedAsync and FedBuff (advised tau_max), and the candidates: memory (MIFA-style
per-client memory, the mode's preset and server_lr 0.5), tiered (FedAT-style, 4 latency tiers)
and fedbuff-fair (FedBuff, K = 100, weighted by inverse contribution rate). The goal: class 8 at
least FedAvg's best, and 0.85 overall in at most half the time of the faster FedAvg arm."""
{_DIGITS}
[data]
partition = "rare_class_on_slow"
rare_class = 8
rare_keep = 1.0
slow_share = 0.1
{_FLEET}
[budget]
max_updates = 1000000
max_seconds = 10800

[eval]
interval_s = 60
target = 0.85

[[algorithms]]
kind = "fedavg"
name = "fedavg-all"
clients_per_round = 100

[[algorithms]]
kind = "fedavg"
name = "fedavg-10of13"
clients_per_round = 10
over_selection = 0.3

[[algorithms]]
kind = "fedasync"
name = "fedasync"
tau_max = "auto"

[[algorithms]]
kind = "fedbuff"
name = "fedbuff-k10"
buffer_size = 10
tau_max = "auto"

# tau_max 1000 everywhere below: nothing of the slow devices is dropped for staleness
[[algorithms]]
kind = "memory"
name = "memory"
tau_max = 1000

[[algorithms]]
kind = "memory"
name = "memory-lr0.5"
server_lr = 0.5
tau_max = 1000

[[algorithms]]
kind = "tiered"
name = "tiered"
tau_max = 1000

[[algorithms]]
kind = "fedbuff-fair"
name = "fedbuff-fair-k100"
tau_max = 1000
''',
    "fedbuff-vs-fedasync": f'''
name = "fedbuff-vs-fedasync"
description = """One fleet, the three algorithms: FedAsync (advised tau_max), FedBuff (K = 10,
server learning rate 1) and synchronous FedAvg selecting 10 devices per round with 30%
over-selection (the first 10 to finish are kept). Data: Dirichlet(0.5) label skew."""
{_DIGITS}
[data]
partition = "dirichlet"
beta = 0.5
{_FLEET}
[budget]
max_updates = 10000
max_seconds = 21600

[eval]
interval_s = 60
target = 0.9

[[algorithms]]
kind = "fedasync"
name = "fedasync"
tau_max = "auto"

[[algorithms]]
kind = "fedbuff"
name = "fedbuff-k10"
buffer_size = 10
server_lr = 1.0
tau_max = "auto"

[[algorithms]]
kind = "fedavg"
name = "fedavg-10of13"
clients_per_round = 10
over_selection = 0.3
''',
    "rate-spike": f'''
name = "rate-spike"
description = """The operator rules on virtual time (docs/operations.md). 30 devices of about 30 s
each send about 1 update/s; from minute 15 to minute 30 every run takes a quarter as long (as if
the fleet had quadrupled), so the rate jumps to about 4/s, then calms. fedasync-rate-rule: the
update-rate rule turns raise-gamma on during the spike and off after it. fedasync-lag-rule: an
aggregator that needs 0.3 s per decision (3.3/s at most) falls behind during the spike; the lag
rule turns freshest-only on and off once the backlog has drained, and the drop rule alerts while
freshest-only drops the backlog."""
{_DIGITS}
[data]
partition = "iid"

[fleet]
devices = 30
latency = {{ kind = "lognormal", median_s = 30.0, sigma = 0.3, jitter = 0.1 }}
phases = [{{ from_s = 900, until_s = 1800, latency_factor = 0.25 }}]

[budget]
max_updates = 100000
max_seconds = 2700

[eval]
interval_s = 60

[[algorithms]]
kind = "fedasync"
name = "fedasync-rate-rule"
tau_max = 100

[algorithms.rules]
interval_s = 10
window_s = 60
hold_s = 30
cooldown_s = 60
rate_high = 2.5
rate_low = 1.5
fairness_min_rate = 0.1

[[algorithms]]
kind = "fedasync"
name = "fedasync-lag-rule"
tau_max = 100
decide_s = 0.3

[algorithms.rules]
interval_s = 10
window_s = 60
hold_s = 30
cooldown_s = 60
lag_high = 200
lag_low = 20
max_drop_share = 0.5
''',
    "dp-tradeoff": f'''
name = "dp-tradeoff"
description = """Issue 27: accuracy against privacy. One fleet (100 long-tail devices, IID digits),
2,000 client updates for each algorithm, user-level central DP with the clip C = 0.2 and the noise
multiplier z in 0.5, 1, 2, 4: DP-FedAvg (20 devices a round), DP-FedBuff (K = 20: noise z·C on the
sum of 20 clipped deltas) and DP-FedAsync (gamma 0.1: noise z·C on each clipped delta, mixed in
as it is), each beside its run without DP. epsilon at delta = 1e-5 under both accounting models
(sampled: each device takes part in a step with probability q; conservative: every step may hold
any device) is in each arm's summary; Flower's DifferentialPrivacyServerSideFixedClipping runs on
the DP-FedAvg arms in bench/flower_side.py."""
{_DIGITS}
[data]
partition = "iid"
{_FLEET}
[budget]
max_updates = 2000
max_seconds = 86400

[eval]
interval_s = 60

[[algorithms]]
kind = "fedavg"
name = "fedavg"
clients_per_round = 20

[[algorithms]]
kind = "fedavg"
name = "dp-fedavg-z0.5"
clients_per_round = 20
dp_clip = 0.2
dp_noise = 0.5

[[algorithms]]
kind = "fedavg"
name = "dp-fedavg-z1"
clients_per_round = 20
dp_clip = 0.2
dp_noise = 1.0

[[algorithms]]
kind = "fedavg"
name = "dp-fedavg-z2"
clients_per_round = 20
dp_clip = 0.2
dp_noise = 2.0

[[algorithms]]
kind = "fedavg"
name = "dp-fedavg-z4"
clients_per_round = 20
dp_clip = 0.2
dp_noise = 4.0

[[algorithms]]
kind = "fedbuff"
name = "fedbuff"
buffer_size = 20
tau_max = "auto"

[[algorithms]]
kind = "fedbuff"
name = "dp-fedbuff-z0.5"
buffer_size = 20
tau_max = "auto"
dp_clip = 0.2
dp_noise = 0.5
dp_population = 100

[[algorithms]]
kind = "fedbuff"
name = "dp-fedbuff-z1"
buffer_size = 20
tau_max = "auto"
dp_clip = 0.2
dp_noise = 1.0
dp_population = 100

[[algorithms]]
kind = "fedbuff"
name = "dp-fedbuff-z2"
buffer_size = 20
tau_max = "auto"
dp_clip = 0.2
dp_noise = 2.0
dp_population = 100

[[algorithms]]
kind = "fedbuff"
name = "dp-fedbuff-z4"
buffer_size = 20
tau_max = "auto"
dp_clip = 0.2
dp_noise = 4.0
dp_population = 100

[[algorithms]]
kind = "fedasync"
name = "fedasync"
gamma = 0.1
tau_max = "auto"

[[algorithms]]
kind = "fedasync"
name = "dp-fedasync-z0.5"
gamma = 0.1
tau_max = "auto"
dp_clip = 0.2
dp_noise = 0.5
dp_population = 100

[[algorithms]]
kind = "fedasync"
name = "dp-fedasync-z1"
gamma = 0.1
tau_max = "auto"
dp_clip = 0.2
dp_noise = 1.0
dp_population = 100

[[algorithms]]
kind = "fedasync"
name = "dp-fedasync-z2"
gamma = 0.1
tau_max = "auto"
dp_clip = 0.2
dp_noise = 2.0
dp_population = 100

[[algorithms]]
kind = "fedasync"
name = "dp-fedasync-z4"
gamma = 0.1
tau_max = "auto"
dp_clip = 0.2
dp_noise = 4.0
dp_population = 100
''',
    "byzantine": f'''
name = "byzantine"
description = """Issue 27: malicious devices and the defences. 50 devices (lognormal, median 60 s),
IID digits, 1,000 client updates; 20% of the devices sign-flip their delta (the [attack] table:
bench/byzantine.py runs every attack of docs/experiments.md, 10% and 20% sign-flip, scale x10,
noise and a backdoor, and no attack). Undefended FedAvg (10 a round), FedAsync and FedBuff
(K = 10) against FedAsync with the poisoning bound in clip mode, with Zeno++ and with both, and
FedBuff with the coordinate-wise median, the trimmed mean (0.2 at each end), Krum and multi-Krum
(f = 2). Flower's FedMedian and Krum run on the FedAvg arm in bench/flower_side.py."""
{_DIGITS}
[data]
partition = "iid"

[fleet]
devices = 50
latency = {{ kind = "lognormal", median_s = 60.0, sigma = 0.5 }}

[budget]
max_updates = 1000
max_seconds = 1000000000

[eval]
interval_s = 600

[attack]
kind = "sign_flip"
share = 0.2

[[algorithms]]
kind = "fedavg"
name = "fedavg"
clients_per_round = 10

[[algorithms]]
kind = "fedasync"
name = "fedasync"
tau_max = "auto"

[[algorithms]]
kind = "fedasync"
name = "fedasync-clip"
tau_max = "auto"
norm_bound = 2.0
norm_action = "clip"

[[algorithms]]
kind = "fedasync"
name = "fedasync-zeno"
tau_max = "auto"
zeno_margin = 0.01

[[algorithms]]
kind = "fedasync"
name = "fedasync-zeno-clip"
tau_max = "auto"
zeno_margin = 0.01
norm_bound = 2.0
norm_action = "clip"

[[algorithms]]
kind = "fedbuff"
name = "fedbuff"
buffer_size = 10

[[algorithms]]
kind = "fedbuff"
name = "fedbuff-median"
buffer_size = 10
robust = "median"

[[algorithms]]
kind = "fedbuff"
name = "fedbuff-trimmed"
buffer_size = 10
robust = "trimmed_mean"
robust_trim = 0.2

[[algorithms]]
kind = "fedbuff"
name = "fedbuff-krum"
buffer_size = 10
robust = "krum"
robust_byzantine = 2

[[algorithms]]
kind = "fedbuff"
name = "fedbuff-multikrum"
buffer_size = 10
robust = "multi_krum"
robust_byzantine = 2
''',
    "million-devices": '''
name = "million-devices"
description = """Issue 16: the simulator at a million devices. The write-up's long-tail fleet,
1,000,000 devices of which at most 100,000 train at once (the others wait their turn, first
come first served), the linear task with 1.25 samples per device, FedAsync with the advised
tau_max, to 100,000 applied updates. A cost test rather than a claim: its wall time and memory
are in docs/experiments.md (simulator cost)."""

[task]
name = "linear"
params = { samples = 1250000 }

[data]
partition = "iid"

[fleet]
devices = 1000000
latency = { kind = "longtail", jitter = 0.2 }
max_concurrency = 100000

[budget]
max_updates = 100000
max_seconds = 86400

[eval]
interval_s = 60

[[algorithms]]
kind = "fedasync"
name = "fedasync-advised"
tau_max = "auto"
''',
}

#: one line per preset for `fedasync simulate --list-presets` (the TOML's `description` has more)
SUMMARIES: dict[str, str] = {
    "iid-longtail": "100 long-tail devices, IID digits: FedAsync vs FedAvg time to 90% accuracy",
    "noniid-jitter": "2 classes per device: jitter of FedAsync at γ 0.5/τ_max 20 vs γ 0.8/τ_max 8",
    "rare-class-dropped": "a class held only by the slowest devices: too small a τ_max loses it",
    "rare-class-fair": "the rare class on the slowest devices: FedAvg, FedAsync, FedBuff and "
    "the modes that keep it (memory, tiered, fedbuff-fair)",
    "fedbuff-vs-fedasync": "one Dirichlet(0.5) fleet: FedAsync, FedBuff (K = 10) and FedAvg",
    "rate-spike": "the operator rules on virtual time: a 4× update-rate spike and a lagging "
    "aggregator",
    "dp-tradeoff": "accuracy against ε: DP-FedAvg, DP-FedBuff and DP-FedAsync at z 0.5–4, "
    "beside their runs without DP",
    "byzantine": "a fifth of the devices sign-flip: FedAvg, FedAsync, FedBuff and the defences "
    "(poisoning bound, Zeno++, median, trimmed mean, Krum)",
    "million-devices": "a million long-tail devices, 100,000 training at once: the simulator's "
    "cost at scale",
}


class UnknownPresetError(ValueError):
    pass


def preset_text(name: str) -> str:
    try:
        return PRESETS[name].lstrip()
    except KeyError:
        raise UnknownPresetError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None


def preset_data(name: str) -> dict[str, Any]:
    return tomllib.loads(preset_text(name))
