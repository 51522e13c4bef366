"""The watched run without Streamlit: the source it polls, the window of steps it fills (window.py), the
layout its loads are computed under (layout.py) and the run's layout changes (layout_changes.py), the
per-tick snapshot (snapshot.py), NVML history (gpu_history.py) and the sampled routing rows for the traffic
model (samples.py)."""
