"""The digits MLP as a torch module; imported only by `DigitsMLP.model`, so only where torch is."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """`features` → `hidden` (ReLU) → `classes`; state_dict names hidden.* then out.*."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(torch.relu(self.hidden(x)))
        return out
