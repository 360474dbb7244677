"""Runtime plumbing every service shares: Redis connections and retries, settings, logging, the
lifecycle, the HTTP service, the metrics endpoint, the process supervisor and a private Redis."""
