"""The imperative shell: Ray actors that apply the plan and move the bytes."""
