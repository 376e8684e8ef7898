// Power / clock / temperature sampling through NVML, loaded at run time with dlopen so the program has
// no link dependency on the driver's management library. Without NVML everything reports "n/a".
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fccli {

struct PowerStats {
  bool valid = false;          // at least one sample was taken
  int samples = 0;
  double power_mean_w = 0, power_peak_w = 0;
  double sm_clock_mean_mhz = 0;
  int sm_clock_min_mhz = 0;
  double temp_mean_c = 0;
  int temp_max_c = 0;
};

class PowerSampler {
 public:
  // Loads NVML and finds the device with PCI bus id `pci_bus_id` (as cudaDeviceGetPCIBusId gives).
  explicit PowerSampler(const std::string& pci_bus_id, int period_ms = 5);
  ~PowerSampler();
  PowerSampler(const PowerSampler&) = delete;
  PowerSampler& operator=(const PowerSampler&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }

  void start();        // begins a background sampling thread (no-op when unavailable)
  PowerStats stop();   // stops it and summarizes (takes one last sample so short runs have one)

 private:
  struct Sample {
    unsigned power_mw = 0, sm_mhz = 0, temp_c = 0;
    bool has_power = false, has_clock = false, has_temp = false;
  };
  Sample sample_once();
  void loop();

  void* lib_ = nullptr;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string why_;
  int period_ms_;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Sample> samples_;

  // NVML entry points (C ABI; return nvmlReturn_t = int, 0 on success).
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  int (*by_pci_)(const char*, void**) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*temp_)(void*, int, unsigned*) = nullptr;
};

}  // namespace fccli
