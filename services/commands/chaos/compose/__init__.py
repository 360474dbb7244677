"""Chaos on the Docker Compose stack: `fedasync chaos --compose`.

The repository's docker-compose.yml, brought up as a user brings it up, with its containers
crashed while it trains (stack.py drives docker and docker compose; run.py the phases and the
figures; reader.py reads the stack's Redis from inside the compose network, as the admin user).
The check is the process harness's: services/stores/exactly_once.py.
"""
