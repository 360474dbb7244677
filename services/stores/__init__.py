"""What lives in Redis, one module each: key names, the policy store, device keys, the ledger,
the evaluations, the backlog, the updates stream entry and the ACL users that guard them."""
