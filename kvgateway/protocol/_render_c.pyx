# cython: language_level=3, binding=True
# The compiled renderer: the pure-Python reference (_render_py.py) compiled unchanged (Cython's
# include), so the two cannot drift; measured at about 30% less render time per batch than the
# interpreted module (docs/performance.md, "The compiled core").
include "_render_py.py"
