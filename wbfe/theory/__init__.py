"""Theory solvers and simulations (docs/math.md §6–§7): ``hermite``, ``teacher_student``, ``hmc``, ``student``
and ``hierarchical``. Nothing is imported here, so that ``import wbfe.theory`` stays light."""
