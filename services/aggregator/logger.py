"""The aggregator's one logger, shared by its parts.

Every part logs under the name the aggregator's lines have always carried
(`fedasync.services.aggregator.service`), so a log line reads the same whichever module wrote
it, and a filter or an alert on that name keeps working.
"""

from __future__ import annotations

import logging

log = logging.getLogger("fedasync.services.aggregator.service")
