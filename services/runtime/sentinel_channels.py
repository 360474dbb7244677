"""The pub/sub channels of Redis Sentinel's protocol that fedasync uses, named once.

Here, in the runtime, because the runtime listens on them (primary_watch.py hears a failover on
`SWITCH_MASTER`); the ACL (services/stores/acl.py, a layer up) grants them to the users that
need them and imports them from here.
"""

from __future__ import annotations

#: the channel Sentinels announce themselves on, through every server and every Sentinel
SENTINEL_HELLO = "__sentinel__:hello"
#: the channel a Sentinel announces a failover on:
#: `<name> <old ip> <old port> <new ip> <new port>`
SWITCH_MASTER = "+switch-master"
