"""Vector access that breaks the IR's alignment rule (a VLOAD/VSTORE whose first element's address is not a multiple of
the vector's size): the interpreter and the PYTHON backend refuse it with a message naming the access; the CPU, which
reads and writes vectors with unaligned moves, still gives the right elements instead of crashing."""
import numpy as np
import pytest

from plugrt import Buffer, Device
from plugrt.compiler import interpreter
from plugrt.compiler.interpreter import InterpreterError
from plugrt.compiler.ir import Kernel, KernelBuilder
from plugrt.dtype import dtypes


def copy4() -> Kernel:
  b = KernelBuilder("copy4")
  out, x = b.buffer("out", dtypes.float32), b.buffer("x", dtypes.float32)
  i = b.global_id(0) * 4
  out.vstore(i, x.vload(i))
  return b.finish()


def test_interpreter_refuses_an_unaligned_vector_access():
  storage = np.zeros(20, np.float32)
  x = np.arange(20, dtype=np.float32)
  interpreter.run(copy4(), [storage[:16], x[:16]], (), (4, 1, 1))  # aligned: fine
  assert storage[:16].tolist() == x[:16].tolist()
  with pytest.raises(InterpreterError, match=r"VLOAD %\d+ of 4 elements at element 0 of 'x' is not aligned: .* not a multiple of 16"):
    interpreter.run(copy4(), [storage[:16], x[1:17]], (), (4, 1, 1))
  with pytest.raises(InterpreterError, match=r"VSTORE %\d+ of 4 elements at element 0 of 'out' is not aligned"):
    interpreter.run(copy4(), [storage[2:18], x[:16]], (), (4, 1, 1))
  b = KernelBuilder("odd_index")  # an index that is not a multiple of the width, in an aligned buffer
  o, y = b.buffer("o", dtypes.int16), b.buffer("y", dtypes.int16)
  o.vstore(0, y.vload(1, 2))
  with pytest.raises(InterpreterError, match="at element 1 of 'y' is not aligned"):
    interpreter.run(b.finish(), [np.zeros(4, np.int16), np.arange(4, dtype=np.int16)], (), (1, 1, 1))


def test_python_backend_refuses_an_unaligned_vector_access():
  dev = Device["PYTHON"]
  prg = dev.program(copy4())
  base, x = Buffer(dev, 20, dtypes.float32), Buffer.from_numpy(np.arange(20, dtype=np.float32), dev)
  prg(base.view(16, offset=16), x.view(16, offset=16), global_size=(4, 1, 1), wait=True)
  assert base.numpy()[4:].tolist() == list(range(4, 20))
  with pytest.raises(IndexError, match=r"reads 4 elements at element 0 of 'x', whose address 0x[0-9a-f]+ is not a multiple of 16"):
    prg(base.view(16), x.view(16, offset=4), global_size=(4, 1, 1), wait=True)
  with pytest.raises(IndexError, match=r"reads elements 16\.\.19 of 'x', which has 16 elements"):
    prg(base.view(16), x.view(16), global_size=(5, 1, 1), wait=True)


@pytest.mark.parametrize("compiler", ["CLANG", "LLVM"])
def test_cpu_reads_and_writes_unaligned_vectors_right(compiler):
  """Undefined in the IR, but the CPU's unaligned moves still move the right elements (a GPU may fault instead)."""
  dev = Device["CPU"]
  prg = dev.program(copy4(), compiler)
  data = np.arange(24, dtype=np.float32)
  out, x = Buffer(dev, 24, dtypes.float32), Buffer.from_numpy(data, dev)
  prg(out.view(16, offset=8), x.view(16, offset=4), global_size=(4, 1, 1), wait=True)
  assert out.numpy()[2:18].tolist() == data[1:17].tolist()
