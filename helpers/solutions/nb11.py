"""Solutions to notebook 11's exercises: judges that run the answer and name what differs."""
import torch

LEVELS = 15  # uint4: 16 values 0..15, so 15 steps between the smallest and the largest


def textbook_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """11.1's reference, the convention the notebook states: per group of ``group`` consecutive
    weights of a row, scale = (max - min) / 15, z = round(-min / scale) in [0, 15],
    q = clamp(round(w / scale) + z, 0, 15); w is about (q - z) * scale."""
    groups = w.unflatten(-1, (-1, group))
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / LEVELS
    z = torch.round(-low / scale).clamp(0, LEVELS)
    q = (torch.round(groups / scale[..., None]) + z[..., None]).clamp(0, LEVELS)
    return q.flatten(-2), scale, z


def exercise_11_1_inputs() -> tuple[torch.Tensor, int]:
    """New weights for 11.1's check: 128 rows of 256, each row with its own magnitude (0.01 to 0.1,
    weights of a trained layer), and the group size 64. Every group holds weights of both signs."""
    generator = torch.Generator().manual_seed(111)
    w = torch.randn(128, 256, generator=generator)
    magnitudes = torch.exp(torch.empty(128, 1).uniform_(-4.6, -2.3, generator=generator))
    return w * magnitudes, 64


def _as_group_tensor(value: object, shape: torch.Size) -> torch.Tensor | None:
    """``value`` as a float64 tensor of ``shape`` (a trailing 1 allowed), else None."""
    if not torch.is_tensor(value):
        return None
    if value.dim() == len(shape) + 1 and value.shape[-1] == 1:
        value = value.squeeze(-1)
    return value.double() if value.shape == shape else None


class Int4TextbookJudge:
    """11.1's judge: runs the learner's ``int4_textbook(w, group)`` on new weights and compares
    (q, scale, z) with the stated convention; names the plausible wrong ones (no zero point, groups
    down the columns, rounding before scaling, values outside [0, 15], 16 steps, a float zero)."""

    def why_not(self, answer: object) -> str | None:
        if not callable(answer):
            return "answer_1 should be your repaired function int4_textbook itself"
        w, group = exercise_11_1_inputs()
        result = answer(w.clone(), group)
        if not (isinstance(result, tuple) and len(result) == 3):
            return "int4_textbook should return three tensors: q, scale, z"
        q_ref, scale_ref, z_ref = (t.double() for t in textbook_int4(w, group))
        q, scale, z = result
        if z is None:
            return ("z is None: an asymmetric range [min, max] needs its zero point, "
                    "z = round(-min / scale), one integer per group")
        if not all(torch.is_tensor(t) for t in (q, scale, z)):
            return "q, scale and z should each be a tensor (z too: one integer zero point per group)"
        groups_shape = scale_ref.shape
        if scale.numel() == scale_ref.numel() and _as_group_tensor(scale, groups_shape) is None:
            return (f"scale has shape {tuple(scale.shape)}: the groups run down the columns. A group "
                    f"is {group} consecutive weights of one row (the input axis, which the matmul "
                    f"sums over): scale and z have shape {tuple(groups_shape)}")
        scale, z = _as_group_tensor(scale, groups_shape), _as_group_tensor(z, groups_shape)
        if scale is None or z is None or q.shape != w.shape:
            return (f"expected q of shape {tuple(w.shape)}, scale and z of shape "
                    f"{tuple(groups_shape)} (one per group of {group} along each row)")
        q = q.double()
        return self._values(w, group, q, scale, z, q_ref, scale_ref, z_ref)

    def _values(self, w, group, q, scale, z, q_ref, scale_ref, z_ref) -> str | None:
        if not torch.isfinite(scale).all() or not (scale > 0).all():
            return ("some scales are zero or not finite: compute scale = (max - min) / 15 from the "
                    "weights themselves, before any rounding")
        if q.min() < 0 or q.max() > LEVELS:
            where = (f"q goes down to {q.min():.0f} (signed int4 is [-8, 7])" if q.min() < 0
                     else f"q reaches {q.max():.0f}")
            return (f"{where}: the stated range is unsigned, 0 to 15; 16 levels have 15 steps, so "
                    "scale = (max - min) / 15 and q = clamp(round(w / scale) + z, 0, 15)")
        if torch.equal(z, torch.zeros_like(z)):
            return ("z is 0 in every group, yet every group has negative weights: an asymmetric range "
                    "[min, max] needs its zero point, z = round(-min / scale), added to round(w / scale); "
                    "without it every negative weight clamps to q = 0")
        if not torch.equal(z, z.round()):
            return ("z has fractional values: in this convention z is an integer in [0, 15] "
                    "(round(-min / scale)); a float zero is the kernel's convention (section 2)")
        if z.min() < 0 or z.max() > LEVELS:
            return "z should lie in [0, 15]: z = round(-min / scale), clamped to the codes' range"
        groups = w.double().unflatten(-1, (-1, group))
        rounded_first = (torch.round(groups) / scale[..., None] + z[..., None]).clamp(0, LEVELS)
        if torch.equal(q, z.repeat_interleave(group, dim=-1)) or torch.allclose(
                q, rounded_first.flatten(-2), atol=1e-6):
            return ("every q equals its group's z: the weights were rounded before the division by "
                    "the scale (round(w) is 0 for weights this small); divide by the scale, then round")
        if not torch.equal(q, q.round()):
            return ("q has fractional values: round after dividing by the scale, "
                    "q = round(w / scale) + z, then clamp to [0, 15]")
        if torch.allclose(scale * 16 / LEVELS, scale_ref, rtol=1e-5, atol=0):
            return ("scale is (max - min) / 16: 16 levels have 15 steps between them, so divide by 15")
        if not torch.allclose(scale, scale_ref, rtol=1e-5, atol=0):
            return "scale should be (max - min) / 15 over each group of the row"
        if not torch.equal(z, z_ref):
            return "z should be round(-min / scale) in each group"
        wrong = (q != q_ref).sum().item()
        if wrong > q.numel() // 1000 or (q - q_ref).abs().max() > 1:
            return f"q differs from clamp(round(w / scale) + z, 0, 15) in {wrong} of {q.numel()} values"
        return None

    def __repr__(self) -> str:
        return "a function returning textbook uint4 codes, scales and integer zero points per group"


class BytesPerWeightJudge:
    """11.2's judge: int4 codes in groups of 64 along the row, a bfloat16 scale and a bfloat16 zero
    per group: 0.5 + 4 / 64 bytes per weight. Names forgetting the scale or zero, float32 ones, one
    code a byte and bits for bytes."""

    EXPECTED = 0.5 + (2 + 2) / 64

    def why_not(self, answer: object) -> str | None:
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return f"the answer should be a number of bytes, not {type(answer).__name__}"
        if abs(answer - self.EXPECTED) <= 1e-6 * self.EXPECTED:
            return None
        named = {
            0.5: "that counts only the codes: each group of 64 also stores a scale and a zero",
            0.5 + 2 / 64: ("that counts one 2-byte number per group: each group stores a scale and "
                           "a zero, 2 bytes each (0.53125 is also group 128's figure)"),
            0.5 + 8 / 64: "that takes float32 scale and zero (4 bytes each); here they are bfloat16",
            1 + 4 / 64: "that stores one 4-bit code a byte; two codes share each byte",
            4 + 32 / 64: "that is in bits; the question asks for bytes (8 bits each)",
        }
        for value, why in named.items():
            if abs(answer - value) <= 1e-6 * value:
                return why
        return "not the bytes per weight of int4 g64 with a bfloat16 scale and zero (the hint may help)"

    def __repr__(self) -> str:
        return "bytes per weight of int4, groups of 64, bfloat16 scale and zero"


SOLUTIONS = {
    "11.1": Int4TextbookJudge,
    "11.2": BytesPerWeightJudge,
}
