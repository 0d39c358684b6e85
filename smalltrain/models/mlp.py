"""A multilayer perceptron for MNIST: 784 inputs, configurable hidden layers, 10 outputs."""
from .. import nn

_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU}


class MLP(nn.Module):
    def __init__(self, in_features=784, hidden=(256,), num_classes=10, activation="relu"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"MLP: unknown activation {activation!r}; expected one of {', '.join(_ACTIVATIONS)}")
        hidden = (hidden,) if isinstance(hidden, int) else tuple(hidden)
        self.config = {"in_features": in_features, "hidden": list(hidden), "num_classes": num_classes,
                       "activation": activation}
        layers, width = [nn.Flatten()], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), _ACTIVATIONS[activation]()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
