"""Solutions to notebook 10's exercises: judges that run the answer and name what differs."""
import torch

E4M3_MAX = 448.0
E4M3_EMAX = 8  # floor(log2(448)): the exponent of e4m3's largest normal value


def spec_e8m0_scales(x: torch.Tensor) -> torch.Tensor:
    """10.1's reference: OCP MX v1.0 scales, 2^(floor(log2(amax)) - emax), one per block of 32
    along the last axis, clamped to e8m0's range."""
    amax = x.abs().unflatten(-1, (-1, 32)).amax(-1)
    return torch.exp2((torch.floor(torch.log2(amax)) - E4M3_EMAX).clamp(-127, 127))


def exercise_10_1_inputs() -> torch.Tensor:
    """New tensors for 10.1's check: 64 rows of 96 (3 blocks each), block magnitudes from 2^-20
    to 2^20, so that every plausible wrong rule differs from the spec in many blocks."""
    generator = torch.Generator().manual_seed(101)
    x = torch.randn(64, 96, generator=generator)
    magnitudes = torch.exp2(40 * torch.rand(64, 3, 1, generator=generator) - 20)
    return (x.unflatten(-1, (3, 32)) * magnitudes).flatten(-2)


def _as_scales(result: object, shape: torch.Size) -> torch.Tensor | None:
    """The answer's scales as a float64 tensor of ``shape`` (a trailing 1 allowed), else None."""
    if not torch.is_tensor(result):
        return None
    if result.dim() == len(shape) + 1 and result.shape[-1] == 1:
        result = result.squeeze(-1)
    if result.shape != shape:
        return None
    return result.double()


class E8m0Judge:
    """10.1's judge: runs the learner's ``e8m0_scales`` on new tensors and compares with the spec;
    names the plausible wrong rules (rounding, no emax, ceil, e5m2's emax, wrong axis)."""

    def why_not(self, answer: object) -> str | None:
        if not callable(answer):
            return "answer_1 should be your repaired function e8m0_scales itself"
        x = exercise_10_1_inputs()
        expected = spec_e8m0_scales(x).double()
        result = answer(x.clone())
        got = _as_scales(result, expected.shape)
        if got is None:
            if torch.is_tensor(result) and result.shape[:2] == (x.shape[0] // 32, x.shape[1]):
                return ("the blocks run down the columns: MX blocks are 32 consecutive elements "
                        "of the last axis (the matmul's contraction axis)")
            return (f"the scales should have shape {tuple(expected.shape)}: one per block of 32 "
                    "consecutive elements along the last axis")
        if torch.equal(got, expected):
            return None
        amax = x.abs().unflatten(-1, (-1, 32)).amax(-1).double()
        if torch.equal(got, torch.exp2(torch.floor(torch.log2(amax)))):
            return ("the scale ignores the element format's largest exponent: subtract emax = 8 "
                    "(e4m3's largest normal value is 1.75 x 2^8 = 448) from floor(log2(amax))")
        if torch.allclose(got, amax / E4M3_MAX, rtol=1e-6, atol=0):
            return ("amax / 448 is not a power of two: an e8m0 scale holds only 2^k; the spec "
                    "floors the exponent of amax, then subtracts emax")
        ratio = amax / E4M3_MAX
        below = torch.exp2(torch.floor(torch.log2(ratio)))
        cast = torch.where(ratio / below >= 1.5, 2 * below, below)  # a cast to e8m0: nearest 2^k
        if torch.equal(got, torch.exp2(torch.round(torch.log2(ratio)))) or torch.equal(got, cast):
            return ("that rounds amax / 448 to the nearest power of two; the spec floors "
                    "log2(amax), then subtracts emax = 8")
        if torch.equal(got, torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))):
            return ("that rounds the exponent up (torchao's RCEIL, NVIDIA's hardware rule); the "
                    "OCP spec floors log2(amax), then subtracts emax = 8")
        if torch.equal(got, torch.exp2(torch.floor(torch.log2(amax)) - 15)):
            return "emax = 15 is e5m2's; the elements here are e4m3, whose emax is 8"
        if not (got > 0).all() or not torch.equal(torch.exp2(torch.round(torch.log2(got))), got):
            return "an MX scale is a positive power of two (e8m0 stores only an exponent)"
        return "these powers of two differ from 2^(floor(log2(amax)) - 8) in some blocks"

    def __repr__(self) -> str:
        return "a function returning OCP MX e8m0 scales for e4m3 blocks of 32"


def exercise_10_2_activation() -> torch.Tensor:
    """10.2's activation: tokens x features, each feature with its own magnitude."""
    x = torch.randn(256, 96, generator=torch.Generator().manual_seed(10))
    return x * torch.linspace(0.1, 10, 96)


def _rounding(answer: torch.Tensor) -> float:
    """The relative error an answer's own dtype explains: bfloat16 or float16, its eps (amax / 448
    rounded once to it, x perhaps rounded to it before: at most eps / 2 each); otherwise 1e-6."""
    if answer.dtype in (torch.bfloat16, torch.float16):
        return torch.finfo(answer.dtype).eps
    return 1e-6


class GradWeightScalesJudge:
    """10.2's judge: the rowwise e4m3 scales of x for dW = dy.T @ x run along the tokens (dim 0):
    one per feature, amax / 448 (in bfloat16 or float16: within that dtype's rounding). Names the
    wrong axis, a single scale, no /448 and e5m2's max."""

    def why_not(self, answer: object) -> str | None:
        x = exercise_10_2_activation()
        if isinstance(answer, float):  # check() turns a one-element tensor into its number
            answer = torch.tensor([answer])
        if not torch.is_tensor(answer):
            return "answer_2 should be a tensor of scales"
        per_feature = x.abs().amax(0).double() / E4M3_MAX
        flat = answer.detach().double().flatten()
        if flat.numel() == 1:
            return ("one scale for the whole tensor is tensorwise scaling; a rowwise recipe has "
                    "one scale per group along the contraction axis")
        if flat.numel() == x.shape[0]:
            return ("one scale per token: that is the forward's axis (x @ W.T contracts over the "
                    "features); dW = dy.T @ x contracts over the tokens, so each feature (column "
                    "of x) gets its own scale")
        if flat.numel() != x.shape[1]:
            return f"expected one scale per feature of x ({x.shape[1]} values)"
        if torch.allclose(flat, per_feature, rtol=_rounding(answer), atol=0):
            return None
        if answer.dtype.itemsize == 1 and answer.is_floating_point():
            return (f"scales stored in {answer.dtype} keep 2 or 3 mantissa bits; fp8 recipes keep "
                    "them in float32 (or bfloat16)")
        if torch.allclose(flat, per_feature * E4M3_MAX, rtol=_rounding(answer), atol=0):
            return "divide each amax by e4m3's largest value, 448: scale = amax / 448"
        if torch.allclose(flat, per_feature * E4M3_MAX / 57344, rtol=_rounding(answer), atol=0):
            return "57344 is e5m2's largest value; this recipe casts x to e4m3 (largest 448)"
        if torch.allclose(flat, per_feature, rtol=2**-6, atol=0):
            return ("these are amax / 448 along the tokens, but rounded further than your answer's "
                    f"dtype ({answer.dtype}) explains: compute them in float32, as the scales are kept")
        return "these are not amax / 448 along the tokens"

    def __repr__(self) -> str:
        return "the e4m3 scales of x along the tokens (one per feature)"


SOLUTIONS = {
    "10.1": E8m0Judge,
    "10.2": GradWeightScalesJudge,
}
