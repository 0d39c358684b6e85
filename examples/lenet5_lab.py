"""A LeNet-5 course lab written the PyTorch way; it runs unchanged on smalltrain (only the imports differ).

The body below is what the lab's PyTorch script says, line for line: an nn.Module with Conv2d/MaxPool2d/Linear,
F.gelu and a hand-written GELU autograd.Function, x.view(-1, 16*4*4), CrossEntropyLoss, Adam, a DataLoader
over MNIST with ToTensor, evaluation under no_grad with torch.max(y_pred.data, 1), and TensorBoard scalars.
Run: python examples/lenet5_lab.py [--epochs 1] [--max-steps N] [--root ./data] [--logdir runs/lab]
"""
import argparse

import smalltrain as torch                       # was: import torch
import smalltrain.nn as nn                       # was: import torch.nn as nn
import smalltrain.nn.functional as F             # was: import torch.nn.functional as F
import smalltrain.optim as optim                 # was: import torch.optim as optim
from smalltrain import datasets, transforms      # was: from torchvision import datasets, transforms
from smalltrain.utils.data import DataLoader     # was: from torch.utils.data import DataLoader
from smalltrain.utils.tensorboard import SummaryWriter  # was: from torch.utils.tensorboard import SummaryWriter


class MyGELU(torch.autograd.Function):
    """GELU, tanh approximation, with its derivative written by hand."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3))))

    @staticmethod
    def backward(ctx, grad_output):
        x, = ctx.saved_tensors
        inner = 0.7978845608 * (x + 0.044715 * torch.pow(x, 3))
        sech2 = 1 / torch.pow(torch.cosh(inner), 2)
        d_inner = 0.7978845608 * (1 + 3 * 0.044715 * torch.pow(x, 2))
        return grad_output * (0.5 * (1 + torch.tanh(inner)) + 0.5 * x * sech2 * d_inner)


class LeNet5(nn.Module):
    def __init__(self, custom_gelu=False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.act = MyGELU.apply if custom_gelu else F.gelu

    def forward(self, x):
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = self.act(self.fc1(x))
        x = self.act(self.fc2(x))
        return self.fc3(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--root", default="./data")
    parser.add_argument("--logdir", default="runs/lenet5_lab")
    parser.add_argument("--custom-gelu", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = datasets.MNIST(args.root, train=True, transform=transforms.ToTensor(), download=True)
    test_set = datasets.MNIST(args.root, train=False, transform=transforms.ToTensor(), download=True)
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=1000, shuffle=False)

    torch.manual_seed(0)
    model = LeNet5(args.custom_gelu).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    writer = SummaryWriter(args.logdir)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                writer.add_scalar("Loss/train", loss.item(), step)
            if args.max_steps and step >= args.max_steps:
                break

        model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for x, y in test_loader:
                x, y = x.to(device), y.to(device)
                y_pred = model(x)
                _, predicted = torch.max(y_pred.data, 1)
                total += y.size(0)
                correct += (predicted == y).sum().item()
        accuracy = 100.0 * correct / total
        writer.add_scalar("Accuracy/test", accuracy, epoch)
        print(f"epoch {epoch + 1}: test accuracy {accuracy:.2f}% after {step} steps")
    writer.close()
    return accuracy


if __name__ == "__main__":
    main()
