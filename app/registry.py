"""Imports every module that registers Gin configurables.

Gin can only bind names that have been registered, so config parsing imports
this module first. Add new agents and backends here.
"""

import agents.cql_sac  # noqa: F401
import agents.dqn  # noqa: F401
import agents.sac  # noqa: F401
import app.entry  # noqa: F401
import buffers.episodic  # noqa: F401
import buffers.prioritized  # noqa: F401
import buffers.reverb_replay  # noqa: F401
import buffers.sequence  # noqa: F401
import buffers.uniform  # noqa: F401
import envs.suite  # noqa: F401
import experiment.config  # noqa: F401
import experiment.dataset_collection  # noqa: F401
import experiment.distributed.config  # noqa: F401
import experiment.offline  # noqa: F401
import experiment.online  # noqa: F401
import preprocessing.features  # noqa: F401
import preprocessing.transforms  # noqa: F401
