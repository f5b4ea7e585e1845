"""Solutions to notebook 03's exercises, computed with PyTorch."""
import torch
from torch.nn import functional as F

from ..data import shapes_dataset
from ..dtype_trace import record_ops
from ..model import ShapesCNN


def _smallest_power_of_two_that_changes_2_in_float16() -> float:
    weight = torch.tensor(2.0, dtype=torch.float16)
    changes = [2.0**-k for k in range(40) if (weight + torch.tensor(2.0**-k, dtype=torch.float16)) != weight]
    return min(changes)


def _cdist_dtype_under_cpu_autocast() -> torch.dtype:
    a, b = torch.randn(4, 3), torch.randn(5, 3)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        return torch.cdist(a, b).dtype


def _casts_in_the_backward_of_an_autocast_forward_and_loss() -> int:
    torch.manual_seed(0)
    model = ShapesCNN().train()
    inputs, labels = shapes_dataset("train", n=4).tensors
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(inputs), labels)
    _, records = record_ops(loss.backward)
    return sum(record.name == "_to_copy" for record in records)


SOLUTIONS = {
    # 03.1: smallest power of two that changes a float16 weight of 2.0 when added
    "03.1": _smallest_power_of_two_that_changes_2_in_float16,
    # 03.2: dtype of torch.cdist on float32 inputs under CPU bfloat16 autocast
    "03.2": _cdist_dtype_under_cpu_autocast,
    # 03.3: number of casts (_to_copy) in the backward pass of a ShapesCNN forward + loss under CPU bf16 autocast
    "03.3": _casts_in_the_backward_of_an_autocast_forward_and_loss,
}

# 03.1's answer, 2**-9 = 0.001953125, is often typed rounded (0.00195); its neighbours 2**-8 and 2**-10 are a factor
# of 2 away, so 1 % tolerance accepts the rounding and nothing else.
TOLERANCES = {"03.1": 0.01}
