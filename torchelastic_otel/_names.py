"""The names the bridge writes and the report reads: span names, event (log record) names, metric names, attribute
keys. One spelling each, so that the two cannot drift apart; a name is part of the bridge's output format (backends'
queries and dashboards use them), so changing one here is a breaking change. Stdlib only, no imports.

"torchelastic.restart" is both a span and the event recorded in it (as torch's agent names the restart).
"""

# ---- spans
AGENT_SHUTDOWN = "torchelastic.agent.shutdown"
ATTEMPT = "torchelastic.attempt"
RENDEZVOUS = "torchelastic.rendezvous"
RUN = "torchelastic.run"
WORKERS_FAILURE = "torchelastic.workers.failure"
WORKERS_START = "torchelastic.workers.start"
WORKERS_STOP = "torchelastic.workers.stop"
WORKER_START = "torchelastic.worker.start"
CHECKPOINT_SAVE = "torchelastic.checkpoint.save"
CHECKPOINT_LOAD = "torchelastic.checkpoint.load"
FRAMEWORK_TRAIN = "torchelastic.framework.train"  # HF Trainer.train, Lightning Trainer.fit
FRAMEWORK_EVALUATE = "torchelastic.framework.evaluate"  # HF Trainer.evaluate, Lightning validation / test loops
FRAMEWORK_SAVE = "torchelastic.framework.save"  # HF Trainer._save_checkpoint, Lightning Trainer.save_checkpoint

# ---- span and event
RESTART = "torchelastic.restart"

# ---- events (log records)
EVENT = "torchelastic.event"
ROOT_CAUSE = "torchelastic.root_cause"
WORKER_EXCEPTION = "torchelastic.worker.exception"
WORKER_FAILURE = "torchelastic.worker.failure"
WORKER_STALLED = "torchelastic.worker.stalled"
WORKER_STATUS_PREFIX = "torchelastic.worker.status."
WORKER_TERMINATED = "torchelastic.worker.terminated"

# ---- metrics
COLLECTIVES_PREFIX = "torchelastic.collectives."
FUNCTION_CALLS = "torchelastic.function.calls"
FUNCTION_DURATION = "torchelastic.function.duration"
ROOT_CAUSE_TIME = "torchelastic.root_cause.time"
WORKERS_FLAKINESS = "torchelastic.workers.flakiness"
WORKERS_REMAINING_RESTARTS = "torchelastic.workers.remaining_restarts"
WORKERS_RESTARTS = "torchelastic.workers.restarts"
WORKERS_RUNS = "torchelastic.workers.runs"
WORKERS_RUN_OUTCOMES = "torchelastic.workers.run_outcomes"
WORKERS_STATE_OBSERVATIONS = "torchelastic.workers.state.observations"
WORKER_COLLECTIVE_SEQ = "torchelastic.worker.collective.seq"
WORKER_STEPS = "torchelastic.worker.steps"
WORKER_STEP_ARRIVAL = "torchelastic.worker.step.arrival"
WORKER_STEP_DURATION = "torchelastic.worker.step.duration"
WORKER_STEP_PHASE_DURATION = "torchelastic.worker.step.phase.duration"
WORKER_STEP_PHASE_MEDIAN = "torchelastic.worker.step.phase.median"
WORKER_STEP_ARRIVAL_MEDIAN = "torchelastic.worker.step.arrival.median"
WORKER_STEP_GPU_IDLE = "torchelastic.worker.step.gpu_idle.duration"  # device-clock steps only
WORKER_PROGRESS_AT_RISK = "torchelastic.worker.progress.at_risk"
WORKER_CHECKPOINT_STEP = "torchelastic.worker.checkpoint.step"
CHECKPOINT_DURATION = "torchelastic.checkpoint.duration"
GOODPUT_TIME = "torchelastic.goodput.time"
FRAMEWORK_METRIC_PREFIX = "torchelastic.framework."  # + the logged key, sanitized: one gauge a key
FRAMEWORK_STEP = "torchelastic.framework.step"  # the framework's global step at its last log
PROCESS_MEMORY_USAGE = "process.memory.usage"
WORKER_CUDA_MEMORY_ALLOCATED = "torchelastic.worker.cuda.memory.allocated"
WORKER_CUDA_MEMORY_RESERVED = "torchelastic.worker.cuda.memory.reserved"
WORKER_CUDA_MEMORY_PEAK = "torchelastic.worker.cuda.memory.peak"
WORKER_CUDA_MEMORY_TOTAL = "torchelastic.worker.cuda.memory.total"
WORKER_CUDA_MEMORY_FULL_IN = "torchelastic.worker.cuda.memory.full_in"

# ---- hardware (OpenTelemetry semantic conventions)
# The devices a worker uses, through NVML (``_torch.worker.devices``): semantic-conventions
# model/hardware/gpu-metrics.yaml, common-metrics.yaml, temperature-metrics.yaml and registry.yaml.
HW_GPU_UTILIZATION = "hw.gpu.utilization"  # gauge, 1 (a fraction); attribute hw.gpu.task
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"  # updowncounter, By
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"  # updowncounter, By
HW_POWER = "hw.power"  # gauge, W; attribute hw.type
HW_ENERGY = "hw.energy"  # counter, J; attribute hw.type
HW_TEMPERATURE = "hw.temperature"  # gauge, Cel; the GPU's sensor, a component of its own (hw.parent)
HW_ID = "hw.id"
HW_NAME = "hw.name"
HW_PARENT = "hw.parent"
HW_TYPE = "hw.type"  # hw.power, hw.energy: "gpu"
HW_VENDOR = "hw.vendor"
HW_MODEL = "hw.model"
HW_DRIVER_VERSION = "hw.driver_version"
HW_FIRMWARE_VERSION = "hw.firmware_version"
HW_SERIAL_NUMBER = "hw.serial_number"
HW_GPU_TASK = "hw.gpu.task"  # hw.gpu.utilization: "general" (NVML's kernel-time share)
HW_SENSOR_LOCATION = "hw.sensor_location"  # hw.temperature

# ---- attributes
AGENT_RESTARTS = "torchelastic.agent_restarts"
CAUSE = "cause"  # torchelastic.goodput.time, torchelastic.worker.progress.at_risk
CHECKPOINT_API = "torchelastic.checkpoint.api"
CHECKPOINT_ASYNC = "torchelastic.checkpoint.async"
CHECKPOINT_BYTES = "torchelastic.checkpoint.bytes"
CHECKPOINT_STEP = "torchelastic.checkpoint.step"
OPERATION = "operation"  # torchelastic.checkpoint.duration: save | load
PHASE = "phase"  # torchelastic.worker.step.phase.duration
#: The values of ``PHASE``: the phases of a training step, in the order the report shows them.
STEP_PHASES = ("input", "forward", "backward", "optimizer", "collective_wait", "other")
DEVICE = "device"  # torchelastic.worker.cuda.memory.*: the CUDA device index
CLOCK = "clock"  # torchelastic.worker.step.phase.*: host | device (CUDA events on the job's stream)
FRAMEWORK = "framework"  # torchelastic.framework.*: hf | lightning
SPLIT = "split"  # torchelastic.framework.*: train | eval | test (hf), the trainer's stage (lightning)
FRAMEWORK_GLOBAL_STEP = "torchelastic.framework.global_step"  # framework spans: the global step at their start
FRAMEWORK_STAGE = "torchelastic.framework.stage"  # framework evaluate spans: eval | validate | sanity_check | test
CUDA_MEMORY_DEVICE = "torchelastic.cuda_memory.device"  # torchelastic.worker.exception of a CUDA OOM: its device,
CUDA_MEMORY_ALLOCATED = "torchelastic.cuda_memory.allocated"  # and the allocator's figures for it (By)
CUDA_MEMORY_RESERVED = "torchelastic.cuda_memory.reserved"
CUDA_MEMORY_PEAK = "torchelastic.cuda_memory.peak"  # max_memory_allocated
CUDA_MEMORY_TOTAL = "torchelastic.cuda_memory.total"  # the device's total memory
DELIVERED_BY = "torchelastic.delivered_by"
ENTRYPOINT = "torchelastic.entrypoint"
EXIT_CODE = "torchelastic.exit_code"
FAILED_RANKS = "torchelastic.failed_ranks"
GLOBAL_RANK = "torchelastic.global_rank"
GROUP_RANK = "torchelastic.group_rank"
LOCAL_RANK = "torchelastic.local_rank"
LOCAL_WORLD_SIZE = "torchelastic.local_world_size"
MAX_RESTARTS = "torchelastic.max_restarts"
METADATA_LOCAL_RANK = "torchelastic.metadata.local_rank"
PROCESS_KIND = "torchelastic.process.kind"
RANK = "torchelastic.rank"
RDZV_BACKEND = "torchelastic.rdzv_backend"
REASON = "torchelastic.reason"
REMAINING_RESTARTS = "torchelastic.remaining_restarts"
RESTART_COUNT = "torchelastic.restart_count"
RESTART_REASON = "torchelastic.restart.reason"
ROLE = "torchelastic.role"
ROLE_RANK = "torchelastic.role_rank"
ROOT_CAUSE_CONSEQUENCES = "torchelastic.root_cause.consequences"
ROOT_CAUSE_CUDA_DEVICE = "torchelastic.root_cause.cuda_memory.device"  # a CUDA OOM's: as CUDA_MEMORY_* below
ROOT_CAUSE_CUDA_ALLOCATED = "torchelastic.root_cause.cuda_memory.allocated"
ROOT_CAUSE_CUDA_RESERVED = "torchelastic.root_cause.cuda_memory.reserved"
ROOT_CAUSE_CUDA_PEAK = "torchelastic.root_cause.cuda_memory.peak"
ROOT_CAUSE_CUDA_TOTAL = "torchelastic.root_cause.cuda_memory.total"
ROOT_CAUSE_LOCAL_RANK = "torchelastic.root_cause.local_rank"
ROOT_CAUSE_PREFIX = "torchelastic.root_cause."
ROOT_CAUSE_RANK = "torchelastic.root_cause.rank"
ROOT_CAUSE_REASON = "torchelastic.root_cause.reason"
ROOT_CAUSE_SIGNAL = "torchelastic.root_cause.signal"
ROOT_CAUSE_TIME_SOURCE = "torchelastic.root_cause.time_source"
ROOT_CAUSE_TIME_UNIX_NANO = "torchelastic.root_cause.time_unix_nano"
RUN_ID = "torchelastic.run_id"
RUN_STATE = "torchelastic.run.state"
SIGNAL = "torchelastic.signal"
SOURCE = "torchelastic.source"
STACK = "torchelastic.stack"
STALLED_SECONDS = "torchelastic.stalled.seconds"
STALLED_SINCE_UNIX_NANO = "torchelastic.stalled.since_unix_nano"
STATE = "torchelastic.state"
WORKER_ID = "torchelastic.worker_id"
WORKER_PID = "torchelastic.worker_pid"
WORKER_PIDS = "torchelastic.worker_pids"
WORLD_SIZE = "torchelastic.world_size"
