"""The ingest service: authenticated HTTP entry of updates for untrusted networks."""
