"""Pure numpy analytics of expert counts: arrays in, arrays out, no Streamlit, no Redis.

Shape legend: T steps, L MoE layers, E logical experts, P physical slots, G GPUs.
"""
