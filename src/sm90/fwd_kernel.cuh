// PLACEHOLDER (being written): the sm90 forward kernel template and its instantiation macro.
#pragma once
#define FLASHCORE_SM90_INSTANTIATE(Element, HeadDim, Causal)
