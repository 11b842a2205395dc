"""The GE options ge-serve knows by name: which compile into an OM through an atc flag,
which only tune GE's own runtime, and which (with which atc flags) name files."""

from __future__ import annotations

# GE option (ge_api_types.h) -> the atc flag that sets the same thing when compiling an OM.
ATC_FLAGS = {
    "ge.exec.precision_mode": "precision_mode",
    "ge.exec.precision_mode_v2": "precision_mode_v2",
    "ge.exec.op_precision_mode": "op_precision_mode",
    "ge.exec.modify_mixlist": "modify_mixlist",
    "ge.opSelectImplmode": "op_select_implmode",
    "ge.optypelistForImplmode": "optypelist_for_implmode",
    "ge.outputDatatype": "output_type",
    "ge.bufferOptimize": "buffer_optimize",
    "ge.enableSmallChannel": "enable_small_channel",
    "ge.enableCompressWeight": "enable_compress_weight",
    "ge.compressWeightConf": "compress_weight_conf",
    "ge.fusionSwitchFile": "fusion_switch_file",
    "ge.INPUT_NODES_SET_FP16": "input_fp16_nodes",
    "ge.insertOpFile": "insert_op_conf",
    "ge.opDebugLevel": "op_debug_level",
    "ge.autoTuneMode": "auto_tune_mode",
    "ge.virtual_type": "virtual_type",
    "ge.deterministic": "deterministic",
    "ge.customizeDtypes": "customize_dtypes",
    "ge.keepDtype": "keep_dtype",
    "ge.exec.opDebugConfig": "op_debug_config",
    "ge.debugDir": "debug_dir",
    "ge.op_compiler_cache_dir": "op_compiler_cache_dir",
    "ge.op_compiler_cache_mode": "op_compiler_cache_mode",
    "ge.op_bank_path": "op_bank_path",
    "ge.mdl_bank_path": "mdl_bank_path",
}
# GE options (ge_api_types.h) that tune GE's own session runtime (devices, memory pools,
# dumps, profiling, timeouts, collective communication) and have no atc flag: an OM run
# through pyACL has no such setting, and they do not change results, so ge-serve accepts
# them with a warning. Any other GE option without an atc flag fails the load: ignoring
# an option that may change what the model computes would serve different results.
RUNTIME_OPTIONS = frozenset(
    {
        "ge.exec.deviceId",
        "ge.session_device_id",
        "ge.exec.sessionId",
        "ge.exec.jobId",
        "ge.graphRunMode",
        "ge.aicoreNum",
        "ge.streamNum",
        "ge.constLifecycle",
        "ge.graphMemoryMaxSize",
        "ge.variableMemoryMaxSize",
        "ge.exec.variable_acc",
        "ge.exec.staticMemoryPolicy",
        "ge.exec.reuseZeroCopyMemory",
        "ge.exec.atomicCleanPolicy",
        "ge.exec.enableDump",
        "ge.exec.dumpPath",
        "ge.exec.dumpStep",
        "ge.exec.dumpMode",
        "ge.exec.dumpData",
        "ge.exec.dumpLayer",
        "ge.exec.enableDumpDebug",
        "ge.exec.dumpDebugMode",
        "ge.exec.enable_exception_dump",
        "ge.exec.profilingMode",
        "ge.exec.profilingOptions",
        "ge.exec.graphExecTimeout",
        "ge.exec.opWaitTimeout",
        "ge.exec.opExecuteTimeout",
        "ge.exec.isUseHcom",
        "ge.exec.isUseHvd",
        "ge.exec.rankId",
        "ge.exec.rankTableFile",
        "ge.exec.podName",
        "ge.exec.hcclFlag",
        "ge.exec.logicalDeviceClusterDeployMode",
        "ge.exec.logicalDeviceId",
        "ge.tuningPath",
    }
)
# GE options (ge_api_types.h, unscoped) whose value is a file or folder path.
FILE_OPTIONS = frozenset(
    {
        "ge.exec.op_precision_mode",
        "ge.exec.modify_mixlist",
        "ge.exec.opDebugConfig",
        "ge.exec.dumpPath",
        "ge.compressWeightConf",
        "ge.fusionSwitchFile",
        "ge.insertOpFile",
        "ge.customizeDtypes",
        "ge.keepDtype",
        "ge.debugDir",
        "ge.tuningPath",
        "ge.op_compiler_cache_dir",
        "ge.op_bank_path",
        "ge.mdl_bank_path",
        "ge.graphParallelOptionPath",
    }
)
# atc flags (CANN's atc reference) whose value is a file or folder path.
ATC_FILE_FLAGS = frozenset(
    {
        "model",
        "weight",
        "om",
        "output",
        "json",
        "singleop",
        "check_report",
        "insert_op_conf",
        "op_name_map",
        "fusion_switch_file",
        "compress_weight_conf",
        "compression_optimize_conf",
        "keep_dtype",
        "customize_dtypes",
        "op_precision_mode",
        "modify_mixlist",
        "op_debug_config",
        "op_bank_path",
        "mdl_bank_path",
        "debug_dir",
        "op_compiler_cache_dir",
        "cluster_config",
        "graph_parallel_option_path",
    }
)
