"""Helpers for the course "Mixed precision in PyTorch, by experiment".

Small on purpose: each module is a page of code that a notebook explains.
"""
from .data import CLASSES, make_loader, shapes_dataset
from .device import (DtypeSpeed, autocast_dtype, check_autocast_dtype, cuda_native_bf16, environment_report,
                     fast_dtypes, needs_grad_scaler, pick_device, speed_profile, strict_fp32, supported_autocast_dtypes,
                     tf32_flags, workload)
from .exercises import check
from .formats import COURSE_DTYPES, bit_fields, format_facts, round_trip, spacing
from .measure import (parameter_bytes, peak_cuda_memory, saved_activation_bytes, saved_activation_bytes_by_dtype,
                      time_it)
from .model import ShapesCNN, load_reference_model
from .train import EvalResult, TrainLog, amp_step, evaluate, make_scaler, train
