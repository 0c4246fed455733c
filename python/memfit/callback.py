"""memfit.MemfitCallback: memfit.check at the start of training (imports transformers)."""
from transformers import TrainerCallback

from .hf import from_model
from .preflight import check


class MemfitCallback(TrainerCallback):
    """A transformers TrainerCallback that runs memfit.check at on_train_begin (on the main
    process), from the model and TrainingArguments / SFTConfig the Trainer passes it.
    `fields` override request fields (e.g. sequence_length=4096)."""

    def __init__(self, gpu=None, **fields):
        self.gpu = gpu
        self.fields = fields
        self.result = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None or not getattr(state, "is_world_process_zero", True):
            return
        self.result = check(from_model(model, args=args, **self.fields), gpu=self.gpu)
