"""The 2-conv MNIST CNN: Conv2d(1,16,3)-ReLU-Conv2d(16,32,3)-ReLU-Flatten-Linear(18432,10)."""
from .. import nn
from ..nn.fusion import layer_act, layer_act_linear


class MnistCnn(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.config = {"num_classes": num_classes}
        self.conv1 = nn.Conv2d(1, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32 * 24 * 24, num_classes)

    def forward(self, x):
        x = layer_act(self.conv1, x, "relu")   # relu(conv(x)), one fused op on CUDA (nn/fusion.py)
        # fc(flatten(relu(conv2(x)))), one fused op on CUDA: its backward writes conv2's gradient directly
        return layer_act_linear(self.conv2, x, "relu", self.flatten, self.fc)
