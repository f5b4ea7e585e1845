import json

import pytest
import torch

import helpers
from helpers import model as model_module
from helpers.data import CLASSES, render_shapes


def test_dataset_is_deterministic_balanced_and_scaled():
    images, labels = render_shapes(80, seed=3)
    again, _ = render_shapes(80, seed=3)
    other, _ = render_shapes(80, seed=4)
    assert images.shape == (80, 3, 32, 32) and images.dtype == torch.uint8
    assert torch.equal(images, again) and not torch.equal(images, other)
    assert torch.bincount(labels, minlength=len(CLASSES)).tolist() == [10] * len(CLASSES)
    inputs, _ = helpers.shapes_dataset("test", n=40).tensors
    assert inputs.dtype == torch.float32 and inputs.min() >= -1 and inputs.max() <= 1


def test_dataset_splits_differ_and_bad_split_is_refused():
    train = helpers.shapes_dataset("train", n=16).tensors[0]
    test = helpers.shapes_dataset("test", n=16).tensors[0]
    assert not torch.equal(train, test)
    with pytest.raises(ValueError, match="'train' or 'test'"):
        helpers.shapes_dataset("validation")


def test_loader_shuffles_reproducibly():
    ds = helpers.shapes_dataset("test", n=64)
    first = [y for _, y in helpers.make_loader(ds, batch_size=64, seed=1)][0]
    again = [y for _, y in helpers.make_loader(ds, batch_size=64, seed=1)][0]
    assert torch.equal(first, again)


def test_model_shapes_and_multiple_of_8_channels():
    model = helpers.ShapesCNN()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, len(CLASSES))
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert all(c.out_channels % 8 == 0 for c in convs)


def test_shipped_checkpoint_classifies_the_first_test_images():
    """The fast loop's guard of the checkpoint (about 0.3 s): the first 256 test images, nearly all right."""
    model = helpers.load_reference_model()
    assert not model.training
    accuracy = helpers.evaluate(model, helpers.shapes_dataset("test", n=256)).accuracy
    assert accuracy >= 0.98  # the recorded 2,000-image accuracy is 0.9995; an untrained model scores ~1/8


@pytest.mark.slow  # renders and classifies all 2,000 test images
def test_shipped_checkpoint_reproduces_its_recorded_accuracy():
    recorded = json.loads(model_module.CHECKPOINT.with_suffix(".json").read_text())
    model = helpers.load_reference_model()
    assert not model.training
    accuracy = helpers.evaluate(model, helpers.shapes_dataset("test")).accuracy
    assert accuracy >= 0.95
    assert abs(accuracy - recorded["test_accuracy"]) <= 0.002  # at most 4 of 2000 images may flip on another CPU


def test_missing_checkpoint_says_how_to_regenerate(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m tools.reference"):
        helpers.load_reference_model(tmp_path / "missing.pt")
