"""Helpers for the course "Mixed precision in PyTorch, by experiment".

Small on purpose: each module is a page of code that a notebook explains.
"""
from .data import CLASSES, make_loader, shapes_dataset
from .device import (autocast_dtype, check_autocast_dtype, environment_report, fast_dtypes, pick_device,
                     supported_autocast_dtypes)
from .exercises import check
from .formats import COURSE_DTYPES, bit_fields, format_facts, round_trip, spacing
from .measure import (parameter_bytes, peak_cuda_memory, saved_activation_bytes, saved_activation_bytes_by_dtype,
                      time_it)
from .model import ShapesCNN, load_reference_model
from .train import EvalResult, TrainLog, amp_step, evaluate, make_scaler, train
