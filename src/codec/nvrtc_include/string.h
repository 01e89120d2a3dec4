/* <string.h> for NVRTC (see README): device code has memcpy built in. */
#pragma once
