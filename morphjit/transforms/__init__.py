"""Program-to-program transforms of the SSA IR: reverse mode (``vjp``), the simplification, CSE and
DCE passes (``passes``), the expansion of composite ops into simpler ones (``expand``) and the
rewrite of pairwise squared distances into GEMMs (``distances``).
"""
from .distances import as_gemms as as_gemms
from .expand import lower as lower
from .passes import optimize as optimize
from .reverse import backward as backward, backward_from as backward_from, vjp as vjp
