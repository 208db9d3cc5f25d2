"""What the benchmark scripts share: the timing protocol (``timing``), the operands and shapes (``operands``), the
providers more than one benchmark times (``providers``), the error check (``checks``), the command line
(``cli``), the results files (``results``) and the plots (``plotting``)."""
