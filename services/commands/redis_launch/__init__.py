"""Redis as real processes for the commands, the benches and the tests: a private redis-server
(`server`: `fedasync up` without a configured Redis) and a replicated Redis under Sentinel
(`sentinel`: `fedasync chaos --profile failover`, the failover tests).

They live with the commands, not in services/runtime/, because they are launchers, not plumbing
a service runs on: they write the ACL file and log in as its users (services/stores/acl.py), a
layer above the runtime, and no service starts a Redis of its own.
"""
