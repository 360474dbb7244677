"""Runtime plumbing every service shares: Redis connections and retries, settings, logging, the
lifecycle, the HTTP service, the metrics endpoint and the process supervisor (the Redis launchers
are the commands': services/commands/redis_launch/)."""
