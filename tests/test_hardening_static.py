"""Static source checks (evaluator_cuda/isolation/static_checks.py): every rule fires on a planted
source, and the honest example solutions (both backends) raise no finding."""

from pathlib import Path

import pytest

from evaluator_cuda.solutions import read_solution
from evaluator_cuda.isolation.static_checks import check_cpp_source, check_python_source, check_solution_sources

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "solutions"


def reasons(findings) -> list[str]:
    return [f.reason for f in findings]


@pytest.mark.parametrize("path", sorted(p for b in ("cuda", "host") for p in (EXAMPLES / b).iterdir() if "__" not in p.name), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_honest_examples_have_no_findings(path):
    assert check_solution_sources(read_solution(path).files) == []


@pytest.mark.parametrize(
    "line,reason",
    [
        ("auto r = torch::matmul(a, b);", "torch_compute_cpp"),
        ("auto r = at::native::add(a, b);", "torch_compute_cpp"),
        ("std::thread t(work);", "threads"),
        ("pthread_create(&t, nullptr, f, nullptr);", "threads"),
        ("system(\"rm -rf /\");", "processes"),
        ("int pid = fork();", "processes"),
        ("cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);", "side_stream"),
        ("attr.accessPolicyWindow.num_bytes = n;", "persisting_l2"),
        ("void* f = dlsym(RTLD_NEXT, \"cudaEventElapsedTime\");", "detour"),
        ("PyImport_ImportModule(\"evaluator_cuda.timing.profile\");", "harness"),
    ],
)
def test_cpp_rules(line, reason):
    assert reason in reasons(check_cpp_source("k.cu", "int main() {\n" + line + "\n}\n"))


def test_cpp_allocation_metadata_and_comments_are_allowed():
    source = """
    // torch::matmul(a, b) in a comment is fine
    /* std::thread in a block comment too */
    auto out = torch::empty_like(x);
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    auto z = at::zeros({4}, opts);
    auto s = at::cuda::getCurrentCUDAStream();
    TORCH_CHECK(x.is_contiguous(), "contiguous");
    """
    assert check_cpp_source("b.cpp", source) == []


@pytest.mark.parametrize(
    "source,reason",
    [
        ("import threading\n", "threads"),
        ("from concurrent.futures import ThreadPoolExecutor\n", "threads"),
        ("import subprocess\n", "processes"),
        ("import os\nos.fork()\n", "processes"),
        ("import socket\n", "network"),
        ("import ctypes\n", "detour"),
        ("import gc\n", "introspection"),
        ("m = __import__('gc')\n", "introspection"),
        ("import sys\nsys.modules['x'] = None\n", "introspection"),
        ("import evaluator_cuda\n", "harness"),
        ("import os\nos.write(3, b'')\n", "channel"),
        ("from model import Model\n", "reference_import"),
        ("import torch\ns = torch.cuda.Stream()\n", "side_stream"),
        ("class Model: pass\nclass ModelNew(Model):\n    pass\n", "inherits_reference"),
        ("class ModelNew:\n    def forward(self, x):\n        try:\n            return f(x)\n        except Exception:\n            return x\n", "fallback"),
        ("import torch\ntorch.cuda.Event.elapsed_time = lambda self, end: 1e-3\n", "monkeypatch"),
        ("import torch.cuda as tc\ntc.synchronize = lambda: None\n", "monkeypatch"),
        ("from torch import testing\ntesting.assert_close = lambda *a, **k: None\n", "monkeypatch"),
        ("import time\ntime.perf_counter_ns, x = (lambda: 0), 1\n", "monkeypatch"),
        ("import torch\ndel torch.cuda.Event.elapsed_time\n", "monkeypatch"),
        ("import torch\nsetattr(torch.cuda, 'synchronize', lambda: None)\n", "monkeypatch"),
        ("CPP = '''\n#include <thread>\nvoid f() { std::thread t([]{}); t.join(); }\n'''\n", "threads"),
    ],
)
def test_python_rules(source, reason):
    assert reason in reasons(check_python_source("model_new.py", source))


def test_python_allowed_forms():
    source = (
        "import torch\nimport cuda_extension\n"
        "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n"  # try/except outside ModelNew
        "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return cuda_extension.f(x)\n"
    )
    assert check_python_source("model_new.py", source) == []
    own_state = (  # assignments to the candidate's own objects and locals are not patching
        "import torch\nimport cuda_extension\nCACHE = {}\n"
        "class ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.scale = 2.0\n"
        "    def forward(self, x):\n        out = cuda_extension.f(x)\n        out[0] = out[0]\n        CACHE['n'] = 1\n        return out\n"
    )
    assert check_python_source("model_new.py", own_state) == []
    assert check_python_source("broken.py", "def (:\n") == []  # syntax errors are reported by the candidate child
