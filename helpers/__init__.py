"""Helpers for the course "Mixed precision in PyTorch, by experiment": general tools in flat modules
(``import helpers``), each notebook's scaffolding in ``helpers.nbNN`` (``from helpers import nbNN as
lab``). Course tooling (statistics, benchmarks, re-executing notebooks) lives in ``tools/``."""

from . import autocast_rules, bench, debugging, dtype_trace, formats, measure, peaks, precision, state, timing
from .data import CLASSES, make_loader, shapes_dataset
from .device import (
    autocast_dtype,
    check_autocast_dtype,
    cuda_native_bf16,
    environment_report,
    machine_stamp,
    needs_grad_scaler,
    pick_device,
    strict_fp32,
    supported_autocast_dtypes,
    tf32_flags,
    workload,
)
from .exercises import check
from .formats import COURSE_DTYPES, bit_fields, format_facts, round_trip, spacing
from .measure import parameter_bytes, saved_activation_bytes, saved_activation_bytes_by_dtype, time_it
from .model import ShapesCNN, load_reference_model
from .precision import Advice, choose_precision, describe_device, native_dtypes
from .training import EvalResult, TrainLog, amp_step, evaluate, make_scaler, train
