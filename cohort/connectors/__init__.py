"""The hubs of tasks and environments, each one module behind one interface (cohort/connectors/base.py's
`Connector`), chosen from the spelling once (cohort/connectors/registry.py). The run holds the chosen ones in its plan
(cohort/plan/run_environment.py's `RunEnvironment`); nothing below the plan names a hub.
"""

from cohort.connectors.base import Connector
from cohort.connectors.registry import CONNECTORS, chosen, connector_class, resolve_environment, routed

__all__ = ["CONNECTORS", "Connector", "chosen", "connector_class", "resolve_environment", "routed"]
