"""StarPO / StarPO-S on RLlib: ``StarPOParams`` (knobs), ``StarPOConfig``, ``StarPO`` (Algorithm),
``StarPOLearner``. Import the submodules directly; this package imports nothing heavy."""
